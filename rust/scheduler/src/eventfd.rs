//! Thin wrapper over a Linux `eventfd(2)` (`EFD_NONBLOCK | EFD_CLOEXEC`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall with constant flags; no pointers involved.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Adds 1 to the counter (makes the fd readable).
    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        loop {
            // SAFETY: writes 8 bytes from a live local `u64` to our own fd.
            let n = unsafe {
                libc::write(
                    self.fd.as_raw_fd(),
                    (&one as *const u64).cast::<libc::c_void>(),
                    8,
                )
            };
            if n == 8 {
                return;
            }
            let err = io::Error::last_os_error();
            // EAGAIN: the counter is at its maximum, so the fd is readable
            // anyway. Anything else cannot happen for a valid eventfd.
            if err.kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    /// Resets the counter to 0 (makes the fd non-readable until the next
    /// `notify`).
    pub(crate) fn clear(&self) {
        let mut value: u64 = 0;
        loop {
            // SAFETY: reads at most 8 bytes into a live local `u64`.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    (&mut value as *mut u64).cast::<libc::c_void>(),
                    8,
                )
            };
            if n == 8 {
                return;
            }
            // EAGAIN: already 0.
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    /// Waits up to `timeout` (forever if `None`) for the fd to become
    /// readable. Returns true if it is readable; false on timeout or signal.
    pub(crate) fn wait_readable(&self, timeout: Option<Duration>) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = match timeout {
            None => -1,
            // Round up so that a sub-millisecond wait still sleeps.
            Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int,
        };
        // SAFETY: `pfd` is a valid, live pollfd array of length 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        n > 0 && pfd.revents & libc::POLLIN != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_after_notify_until_clear() {
        let e = EventFd::new().unwrap();
        assert!(!e.wait_readable(Some(Duration::ZERO)));
        e.notify();
        e.notify();
        assert!(e.wait_readable(Some(Duration::ZERO)));
        e.clear();
        assert!(!e.wait_readable(Some(Duration::from_millis(1))));
        e.clear();
    }
}
