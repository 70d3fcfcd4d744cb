//! The user-notification side: passing the listener from the box to the supervisor, and the
//! supervisor's answers to the calls the filter refuses and records ([`Denial`]).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use libc::{c_int, c_void};

use super::policy::denial_errno;
use super::syscall_name;
use crate::sys;

/// A refused system call, as reported by [`answer_notification`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// System-call number (native architecture).
    pub nr: i64,
    /// Kernel name (`"ptrace"`), or `"syscall_<nr>"` for a number this crate does not know.
    pub name: String,
    /// The six raw arguments.
    pub args: [u64; 6],
    /// The errno the call failed with.
    pub errno: i32,
}

// ---------------------------------------------------------------------------------------------
// Passing the listener to the supervisor
// ---------------------------------------------------------------------------------------------

/// A control message carrying exactly one fd: `CMSG_SPACE(sizeof(int))` bytes, laid out as the
/// kernel expects (`cmsghdr` is 8-byte aligned and 16 bytes long on 64-bit Linux).
#[repr(C)]
pub(super) struct OneFdCmsg {
    hdr: libc::cmsghdr,
    fd: c_int,
}

// SAFETY: CMSG_LEN only does arithmetic on its argument.
const ONE_FD_CMSG_LEN: u32 = unsafe { libc::CMSG_LEN(size_of::<c_int>() as u32) };

/// Sends `fd` over the connected `AF_UNIX` socket `sock` with `SCM_RIGHTS`, along with one data
/// byte. Returns the raw `sendmsg` result (`1`, or `-errno`); retries on `EINTR`.
///
/// Async-signal-safe: the control message lives on the stack and the call is a raw system call.
///
/// # Safety
/// `sock` and `fd` must be file descriptors the caller owns (the call does not take ownership).
pub unsafe fn send_fd(sock: i32, fd: i32) -> isize {
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast::<c_void>(),
        iov_len: 1,
    };
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut cmsg: OneFdCmsg = unsafe { std::mem::zeroed() };
    cmsg.hdr.cmsg_len = ONE_FD_CMSG_LEN as _;
    cmsg.hdr.cmsg_level = libc::SOL_SOCKET;
    cmsg.hdr.cmsg_type = libc::SCM_RIGHTS;
    cmsg.fd = fd;
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = (&mut cmsg as *mut OneFdCmsg).cast::<c_void>();
    msg.msg_controllen = size_of::<OneFdCmsg>() as _;
    loop {
        // SAFETY: `msg` and everything it points to live on this stack frame for the call.
        let ret = unsafe {
            sys::syscall3(
                libc::SYS_sendmsg,
                sock as usize,
                &msg as *const libc::msghdr as usize,
                libc::MSG_NOSIGNAL as usize,
            )
        };
        if ret != -(libc::EINTR as isize) {
            return ret;
        }
    }
}

/// Receives one fd sent by [`send_fd`] from `sock` (with `MSG_CMSG_CLOEXEC`).
///
/// Fails with `UnexpectedEof` if the peer closed the socket without sending one, and with
/// `InvalidData` (closing whatever arrived) if the message carried anything but exactly one fd.
pub fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    const MAX_FDS: usize = 8;
    // 8-byte aligned room for a control message of up to MAX_FDS fds.
    let mut control = [0u64; (16 + MAX_FDS * size_of::<c_int>()).div_ceil(8)];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast::<c_void>(),
        iov_len: byte.len(),
    };
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast::<c_void>();
    msg.msg_controllen = size_of_val(&control) as _;

    let received = loop {
        // SAFETY: `msg` points to live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };

    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: `msg` was filled by recvmsg; the CMSG_* helpers stay within msg_controllen.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: non-null headers returned by CMSG_FIRSTHDR/NXTHDR lie inside `control`.
        let hdr = unsafe { std::ptr::read_unaligned(cmsg) };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: as above; CMSG_LEN(0) is arithmetic.
            let (data, header_len) = unsafe { (libc::CMSG_DATA(cmsg), libc::CMSG_LEN(0)) };
            let count =
                (hdr.cmsg_len as usize).saturating_sub(header_len as usize) / size_of::<c_int>();
            for i in 0..count {
                // SAFETY: the kernel wrote `count` fds after the header, inside `control`.
                let raw = unsafe { std::ptr::read_unaligned(data.cast::<c_int>().add(i)) };
                // SAFETY: SCM_RIGHTS installed `raw` in this process for us to own.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: `cmsg` is a valid header inside `msg`'s control buffer.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }

    if received == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the socket without sending an fd",
        ));
    }
    if fds.len() != 1 || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected one fd, received {} (flags {:#x})",
                fds.len(),
                msg.msg_flags
            ),
        ));
    }
    Ok(fds.pop().expect("one fd"))
}

// ---------------------------------------------------------------------------------------------
// Supervisor
// ---------------------------------------------------------------------------------------------

/// `ioctl` on the listener, retrying on `EINTR`.
fn listener_ioctl<T>(fd: c_int, request: libc::Ioctl, arg: *mut T) -> io::Result<()> {
    loop {
        // SAFETY: `arg` points to a live value of the type `request` expects.
        if unsafe { libc::ioctl(fd, request, arg) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Answers one pending notification on `listener`, never blocking.
///
/// Call it when `poll` reports the listener readable (looping until it returns `Ok(None)` is
/// fine). Receives one notification with `SECCOMP_IOCTL_NOTIF_RECV`, fails the system call with
/// `SECCOMP_IOCTL_NOTIF_SEND` (`EPERM`, `EAFNOSUPPORT` for a refused socket domain, `ENOSYS` for
/// an unlisted call; never `CONTINUE`) and returns what was refused. `Ok(None)` when nothing is
/// pending or the calling thread vanished (was killed or interrupted) before the answer.
pub fn answer_notification(listener: BorrowedFd<'_>) -> io::Result<Option<Denial>> {
    let fd = listener.as_raw_fd();
    // NOTIF_RECV blocks while nothing is pending, so look first.
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 0) } >= 0 {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    if pfd.revents & libc::POLLIN == 0 {
        return Ok(None);
    }

    // SAFETY: all-zero is a valid seccomp_notif, and the kernel requires it zeroed.
    let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    match listener_ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut notif) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    }

    let nr = i64::from(notif.data.nr);
    let errno = denial_errno(nr, &notif.data.args);
    let mut resp = libc::seccomp_notif_resp {
        id: notif.id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    match listener_ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    }
    Ok(Some(Denial {
        nr,
        name: syscall_name(nr).map_or_else(|| format!("syscall_{nr}"), str::to_owned),
        args: notif.data.args,
        errno,
    }))
}
