//! Raw system calls that never touch `errno`.
//!
//! The spawn path clones a child that shares the parent's address space (`CLONE_VM`, like
//! `posix_spawn`) and therefore also the parent thread's TLS block. A libc wrapper that fails
//! in the child would write the *parent thread's* `errno`. Everything the child runs goes
//! through these functions instead: they return the kernel's raw result, `-errno` on failure.

/// Raw result of a system call: non-negative on success, `-errno` on failure.
pub type RawResult = isize;

/// Issues system call `nr` with up to six arguments and returns the raw kernel result.
///
/// # Safety
/// The caller must pass arguments that are valid for `nr` (pointers must point to memory of the
/// size and layout the kernel expects, for as long as the call runs).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn syscall6(
    nr: i64,
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    e: usize,
    f: usize,
) -> RawResult {
    let ret: isize;
    // SAFETY: the x86_64 Linux syscall ABI: number in rax, arguments in rdi, rsi, rdx, r10, r8,
    // r9; the kernel clobbers rcx and r11 and returns in rax. Argument validity is the caller's
    // contract.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a, in("rsi") b, in("rdx") c, in("r10") d, in("r8") e, in("r9") f,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Issues system call `nr` with up to six arguments and returns the raw kernel result.
///
/// # Safety
/// The caller must pass arguments that are valid for `nr`.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub unsafe fn syscall6(
    nr: i64,
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    e: usize,
    f: usize,
) -> RawResult {
    let ret: isize;
    // SAFETY: the aarch64 Linux syscall ABI: number in x8, arguments in x0..x5, result in x0.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") nr,
            inlateout("x0") a as isize => ret,
            in("x1") b, in("x2") c, in("x3") d, in("x4") e, in("x5") f,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("agentrl-sandbox supports x86_64 and aarch64 Linux only");

/// Three-argument shorthand for [`syscall6`].
///
/// # Safety
/// As for [`syscall6`].
#[inline(always)]
pub unsafe fn syscall3(nr: i64, a: usize, b: usize, c: usize) -> RawResult {
    // SAFETY: forwarded contract.
    unsafe { syscall6(nr, a, b, c, 0, 0, 0) }
}

/// Five-argument shorthand for [`syscall6`].
///
/// # Safety
/// As for [`syscall6`].
#[inline(always)]
pub unsafe fn syscall5(nr: i64, a: usize, b: usize, c: usize, d: usize, e: usize) -> RawResult {
    // SAFETY: forwarded contract.
    unsafe { syscall6(nr, a, b, c, d, e, 0) }
}

/// Converts a raw result into `Ok(value)` or `Err(errno)`.
#[inline(always)]
pub fn check(ret: RawResult) -> Result<usize, i32> {
    if ret < 0 {
        Err((-ret) as i32)
    } else {
        Ok(ret as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getpid_matches_libc() {
        // SAFETY: getpid takes no arguments.
        let raw = unsafe { syscall3(libc::SYS_getpid, 0, 0, 0) };
        assert_eq!(raw as i32, std::process::id() as i32);
    }

    #[test]
    fn failure_returns_negative_errno_without_touching_errno() {
        // SAFETY: close on an fd that cannot be open; no memory is passed.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: as above.
        let raw = unsafe { syscall3(libc::SYS_close, 1_000_000, 0, 0) };
        assert_eq!(check(raw), Err(libc::EBADF));
        // SAFETY: reading this thread's errno.
        assert_eq!(unsafe { *libc::__errno_location() }, 0);
    }
}
