//! The kernel structures the supervisor uses, and passing the listener between processes.

use super::*;

#[test]
fn kernel_structure_sizes() {
    let mut sizes = libc::seccomp_notif_sizes {
        seccomp_notif: 0,
        seccomp_notif_resp: 0,
        seccomp_data: 0,
    };
    // SAFETY: GET_NOTIF_SIZES writes one seccomp_notif_sizes.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_NOTIF_SIZES,
            0,
            &mut sizes as *mut _,
        )
    };
    assert_eq!(ret, 0, "{}", io::Error::last_os_error());
    assert_eq!(
        usize::from(sizes.seccomp_notif),
        size_of::<libc::seccomp_notif>()
    );
    assert_eq!(
        usize::from(sizes.seccomp_notif_resp),
        size_of::<libc::seccomp_notif_resp>()
    );
    assert_eq!(
        usize::from(sizes.seccomp_data),
        size_of::<libc::seccomp_data>()
    );
    assert_eq!(OFF_NR, 0);
    assert_eq!(OFF_ARCH, 4);
    assert_eq!(arg_low(0), 16);
    assert_eq!(arg_low(5), 56);
    // SAFETY: arithmetic only.
    assert_eq!(
        size_of::<OneFdCmsg>(),
        unsafe { libc::CMSG_SPACE(size_of::<c_int>() as u32) } as usize
    );
}

#[test]
fn fd_passing_round_trip() {
    let (a, b) = socketpair();
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    // SAFETY: both fds are open for the duration of the call.
    assert_eq!(unsafe { send_fd(a.as_raw_fd(), file.as_raw_fd()) }, 1);
    let got = recv_fd(b.as_fd()).unwrap();
    assert_ne!(got.as_raw_fd(), file.as_raw_fd());
    // SAFETY: F_GETFD on an owned fd.
    let flags = unsafe { libc::fcntl(got.as_raw_fd(), libc::F_GETFD) };
    assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    let same = |f: &dyn AsRawFd| {
        // SAFETY: all-zero stat is valid; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and buffer.
        assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), &mut st) }, 0);
        (st.st_dev, st.st_ino)
    };
    assert_eq!(same(&got), same(&file));

    // Data without an fd, then EOF.
    // SAFETY: writing one byte from a live buffer.
    assert_eq!(
        unsafe { libc::write(a.as_raw_fd(), b"x".as_ptr().cast(), 1) },
        1
    );
    assert_eq!(
        recv_fd(b.as_fd()).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    drop(a);
    assert_eq!(
        recv_fd(b.as_fd()).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
}

#[test]
fn nothing_pending_is_none() {
    // A non-listener fd that is not readable: answer_notification must not block.
    let (a, _b) = socketpair();
    assert!(answer_notification(a.as_fd()).unwrap().is_none());
}
