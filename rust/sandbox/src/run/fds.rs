//! Small fd helpers of the supervisor's side: pipes, a memfd holding some bytes, `O_NONBLOCK`,
//! and SIGKILL through a pidfd.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// SIGKILL through a pidfd.
pub(crate) fn kill(pidfd: BorrowedFd<'_>) {
    // SAFETY: pidfd_send_signal on a valid pidfd with a NULL siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<u8>(),
            0,
        )
    };
}

/// Creates a pipe whose two ends are close-on-exec.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a valid fd.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// A close-on-exec memfd holding `data`, positioned at its start.
pub(crate) fn memfd_with(data: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = crate::sys::memfd_create(c"agentrl", libc::MFD_CLOEXEC)?;
    let fd = crate::mounts::write_all(fd, data)?;
    // SAFETY: valid fd.
    unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_SET) };
    Ok(fd)
}
