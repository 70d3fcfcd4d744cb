//! The parent's side of the clone: the child's stack ([`ChildStack`]), the clone itself
//! ([`clone_child`]) and the pointer arrays of `execve` ([`ptr_array`]).

use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::RawFd;

use super::child::child_entry;
use super::ChildPlan;

/// A stack for the clone child: an anonymous mapping with a guard page at its low end.
pub struct ChildStack {
    base: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it is used by one child at a time.
unsafe impl Send for ChildStack {}

impl ChildStack {
    /// Maps `len` bytes plus a guard page.
    pub fn new(len: usize) -> std::io::Result<ChildStack> {
        let page = 4096;
        let total = len + page;
        // SAFETY: anonymous private mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the first page of our own mapping becomes the guard.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: unmapping what we mapped.
            unsafe { libc::munmap(base, total) };
            return Err(e);
        }
        Ok(ChildStack { base, len: total })
    }

    /// The initial stack pointer (top of the mapping, 16-byte aligned).
    pub fn top(&self) -> *mut c_void {
        // SAFETY: one-past-the-end of our own mapping.
        unsafe { (self.base as *mut u8).add(self.len) as *mut c_void }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping we own; no child uses it any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Clones the child. Returns `(pid, pidfd)`.
///
/// # Safety
/// `plan` must stay alive and unmodified until the child has exec'd or exited; `stack` must
/// not be used by another child at the same time; the calling thread should have every signal
/// blocked (the child inherits the mask and resets dispositions before unblocking).
pub unsafe fn clone_child(
    plan: &ChildPlan<'_>,
    stack: &ChildStack,
    flags: c_int,
) -> std::io::Result<(libc::pid_t, RawFd)> {
    let mut pidfd: c_int = -1;
    // SAFETY: child_entry matches the callback type; the stack top is valid; plan outlives the
    // child's use of it (caller's contract); &mut pidfd receives the pidfd (CLONE_PIDFD).
    let pid = unsafe {
        libc::clone(
            child_entry,
            stack.top(),
            flags | libc::CLONE_VM | libc::CLONE_PIDFD,
            plan as *const ChildPlan<'_> as *mut c_void,
            &mut pidfd as *mut c_int,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((pid, pidfd))
}

/// Builds a NULL-terminated pointer array over C strings.
pub fn ptr_array(v: &[CString]) -> Vec<*const c_char> {
    v.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}
