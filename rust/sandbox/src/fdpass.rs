//! Messages with file descriptors over `AF_UNIX` `SOCK_SEQPACKET` sockets (the warm
//! interpreter's control channel).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A warm run's request: its 7 fds and those passed to the run.
const MAX_FDS: usize = 7 + crate::config::MAX_PASS_FDS;
// The control buffers below (128 bytes) hold a header (16) and MAX_FDS fds.
const _: () = assert!(16 + 4 * MAX_FDS <= 128);

/// Sends one message carrying `data` and `fds`.
pub fn send(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS, "too many fds in one message");
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut _,
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE/CMSG_LEN compute sizes only.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer is large enough (16 u64 = 128 bytes; 15 fds take 80) and
        // aligned; CMSG_FIRSTHDR returns a pointer into it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: msg points to valid buffers for the duration of the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives a one-byte message without allocating (the warm interpreter waits this way
/// while its run's files may still fill the slot's memory): `Ok(None)` at end of file.
pub fn recv_byte(sock: BorrowedFd<'_>) -> io::Result<Option<u8>> {
    let mut b = [0u8; 1];
    loop {
        // SAFETY: reading at most one byte into a valid buffer.
        let r = unsafe { libc::recv(sock.as_raw_fd(), b.as_mut_ptr().cast(), 1, 0) };
        if r > 0 {
            return Ok(Some(b[0]));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message: `Ok(None)` at end of file, `Err(TimedOut)` after `timeout`.
pub fn recv(
    sock: BorrowedFd<'_>,
    timeout: Option<Duration>,
) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    if let Some(t) = timeout {
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = t.as_millis().min(i32::MAX as u128) as i32;
        loop {
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no message in time",
                ));
            }
            if n > 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
    }
    // The message's size first (it stays queued), so that the buffer is exactly as large as
    // the message and never needs zeroing: in the warm interpreter every page written here
    // would be copied again after each fork.
    let len = loop {
        // SAFETY: a zero-length peek; no buffer is written.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_PEEK | libc::MSG_TRUNC,
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut data: Vec<u8> = Vec::with_capacity(len.max(1));
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.capacity(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: msg points to valid buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count =
                    ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let p = libc::CMSG_DATA(c) as *const RawFd;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the message was truncated",
        ));
    }
    // SAFETY: recvmsg initialised the first n bytes (n <= capacity).
    unsafe { data.set_len(n) };
    Ok(Some((data, fds)))
}

/// Raises the largest message `sock` can send to `bytes` (past the system's
/// `wmem_max` where the caller may: `SO_SNDBUFFORCE` needs `CAP_NET_ADMIN`). Best effort:
/// a larger message then fails with `EMSGSIZE`.
pub fn set_send_buffer(sock: BorrowedFd<'_>, bytes: usize) {
    let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
    for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
        // SAFETY: setsockopt with a valid int option value.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return;
        }
    }
}

/// A connected `SOCK_SEQPACKET` pair, close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut sp = [0; 2];
    // SAFETY: sp is a valid two-element array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sp.as_mut_ptr(),
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(sp[0]), OwnedFd::from_raw_fd(sp[1])) })
}
