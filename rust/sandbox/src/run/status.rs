//! Reading what the box reports: its seccomp listener ([`receive_listener`]), the status
//! record of its set-up ([`read_status`]) and its init's exit record ([`read_exit_record`]).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use super::error::Cause;
use super::fds::set_nonblocking;
use crate::seccomp;
use crate::spawn::Step;

/// Receives the child's seccomp listener (sent just before it runs untrusted code).
pub(crate) fn receive_listener(sock: BorrowedFd<'_>) -> Result<OwnedFd, Cause> {
    // The child sends the listener before its set-up ends (the status pipe's end of file,
    // which the caller has seen), so it is already queued unless the child died first. This
    // end of the socket pair holds the other end too, so a dead child never shows as end of
    // file here: wait a bounded time instead of forever.
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ready = loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break n;
        }
    };
    if ready <= 0 {
        return Err("the box ended its set-up without handing over its seccomp listener".into());
    }
    let listener = seccomp::recv_fd(sock).map_err(Cause::io("receiving the seccomp listener"))?;
    set_nonblocking(listener.as_raw_fd());
    Ok(listener)
}

/// Reads the child's set-up status pipe: `None` at end of file (exec happened), or the step
/// that failed and its errno.
pub(crate) fn read_status(
    status_r: BorrowedFd<'_>,
    limit: Duration,
) -> Result<Option<(Step, i32)>, Cause> {
    let mut rec = [0u8; 8];
    let mut got = 0;
    let deadline = Instant::now() + limit;
    loop {
        let mut pfd = libc::pollfd {
            fd: status_r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
        if n == 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "the child did not finish its set-up within {} s",
                    limit.as_secs()
                )
                .into());
            }
            continue;
        }
        // SAFETY: reading into the remaining part of rec.
        let r = unsafe {
            libc::read(
                status_r.as_raw_fd(),
                rec[got..].as_mut_ptr().cast(),
                8 - got,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Cause::io("reading the child's status")(e));
        }
        if r == 0 {
            break;
        }
        got += r as usize;
        if got == 8 {
            break;
        }
    }
    if got < 8 {
        return Ok(None);
    }
    let step = u32::from_ne_bytes([rec[0], rec[1], rec[2], rec[3]]);
    let errno = i32::from_ne_bytes([rec[4], rec[5], rec[6], rec[7]]);
    match Step::from_u32(step) {
        // The program started (pid 1 is becoming its init).
        Some(Step::Started) => Ok(None),
        Some(s) => Ok(Some((s, errno))),
        None => Err(format!("box set-up failed at an unknown step {step}: errno {errno}").into()),
    }
}

/// The 4-byte wait status the box's init writes when the program exits, if any.
pub(super) fn read_exit_record(status_r: BorrowedFd<'_>) -> Option<i32> {
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        // SAFETY: reading into the rest of a valid buffer; every writer is gone, so this
        // cannot block.
        let n = unsafe { libc::read(status_r.as_raw_fd(), b[got..].as_mut_ptr().cast(), 4 - got) };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            break;
        }
    }
    (got == 4).then(|| i32::from_ne_bytes(b))
}
