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

/// The calling thread's kernel thread id.
///
/// A raw system call rather than `libc::gettid`: glibc has that wrapper only since 2.30, and
/// the wheel is built for manylinux_2_17, whose glibc does not export the symbol (a reference
/// to it would make the extension fail to load there).
#[inline]
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { syscall3(libc::SYS_gettid, 0, 0, 0) as libc::pid_t }
}

/// `memfd_create(2)`: a new anonymous file, as an owned fd.
///
/// A raw system call rather than `libc::memfd_create` (glibc 2.27+), for the reason given at
/// [`gettid`].
pub fn memfd_create(
    name: &std::ffi::CStr,
    flags: libc::c_uint,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: `name` is NUL-terminated and outlives the call; the kernel only reads it.
    let ret = unsafe {
        syscall3(
            libc::SYS_memfd_create,
            name.as_ptr() as usize,
            flags as usize,
            0,
        )
    };
    match check(ret) {
        // SAFETY: a fresh fd that nothing else owns.
        Ok(fd) => Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }),
        Err(errno) => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gettid_is_the_thread_id() {
        // /proc/thread-self names the calling thread as "<pid>/task/<tid>".
        fn from_proc() -> libc::pid_t {
            let link = std::fs::read_link("/proc/thread-self").unwrap();
            link.file_name().unwrap().to_str().unwrap().parse().unwrap()
        }
        assert_eq!(gettid(), from_proc());
        let (theirs, proc_says) = std::thread::spawn(|| (gettid(), from_proc()))
            .join()
            .unwrap();
        assert_eq!(theirs, proc_says);
        assert_ne!(theirs, gettid());
    }

    #[test]
    fn memfd_create_gives_a_cloexec_file() {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        let fd = memfd_create(c"t", libc::MFD_CLOEXEC).unwrap();
        // SAFETY: F_GETFD on an fd we own.
        let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(fl & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let mut f = std::fs::File::from(fd);
        f.write_all(b"abc").unwrap();
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "abc");
        let e = memfd_create(c"t", 0xdead_0000).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

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
