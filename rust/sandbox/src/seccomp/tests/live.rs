//! Live tests of the filter and the supervisor, in forked children.

use super::*;

mod programs;

// -----------------------------------------------------------------------------------------
// Live tests: a forked child installs the filter and the test answers its notifications.
// -----------------------------------------------------------------------------------------

fn raw_exit(code: i32) -> ! {
    // SAFETY: exit_group takes no pointers and does not return.
    unsafe { sys::syscall3(libc::SYS_exit_group, code as usize, 0, 0) };
    unreachable!()
}

fn errno_of(ret: isize) -> i32 {
    if ret < 0 {
        (-ret) as i32
    } else {
        0
    }
}

struct Outcome {
    status: c_int,
    denials: Vec<Denial>,
}

impl Outcome {
    fn exit_code(&self) -> i32 {
        assert!(
            libc::WIFEXITED(self.status),
            "child did not exit: status {:#x}",
            self.status
        );
        libc::WEXITSTATUS(self.status)
    }
}

/// Forks; the child sets no_new_privs, installs the filter, sends the listener, closes it and
/// exits with `body()`, which must use raw system calls only (the test harness is
/// multi-threaded). The parent answers notifications until the child exits.
fn sandboxed(policy: Policy, body: impl FnOnce() -> i32) -> Outcome {
    let filter = Filter::compile(&policy);
    let (parent_sock, child_sock) = socketpair();
    // SAFETY: the child only makes raw system calls before exiting or exec'ing.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain prctl with integer arguments.
        let ret = unsafe {
            sys::syscall5(
                libc::SYS_prctl,
                libc::PR_SET_NO_NEW_PRIVS as usize,
                1,
                0,
                0,
                0,
            )
        };
        if ret != 0 {
            raw_exit(200);
        }
        // SAFETY: single-threaded child with no_new_privs set.
        let listener = match unsafe { filter.install() } {
            Ok(fd) => fd,
            Err(_) => raw_exit(201),
        };
        // The listener is close-on-exec.
        let flags = raw(
            libc::SYS_fcntl,
            [listener as usize, libc::F_GETFD as usize, 0, 0, 0, 0],
        );
        if flags < 0 || flags & libc::FD_CLOEXEC as isize == 0 {
            raw_exit(203);
        }
        // SAFETY: both fds are open in this process.
        if unsafe { send_fd(child_sock.as_raw_fd(), listener) } != 1 {
            raw_exit(202);
        }
        // SAFETY: closing fds this process owns; the box must not keep its listener.
        unsafe {
            sys::syscall3(libc::SYS_close, listener as usize, 0, 0);
            sys::syscall3(libc::SYS_close, child_sock.as_raw_fd() as usize, 0, 0);
        }
        raw_exit(body());
    }
    drop(child_sock);
    let listener = recv_fd(parent_sock.as_fd()).unwrap_or_else(|e| {
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        panic!("no listener ({e}); child status {status:#x}");
    });
    supervise(pid, listener.as_fd())
}

fn supervise(pid: libc::pid_t, listener: BorrowedFd<'_>) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut denials = Vec::new();
    loop {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 5) };
        while let Some(d) = answer_notification(listener).unwrap() {
            denials.push(d);
        }
        let mut status = 0;
        // SAFETY: polling our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            while let Some(d) = answer_notification(listener).unwrap() {
                denials.push(d);
            }
            return Outcome { status, denials };
        }
        assert_eq!(r, 0, "waitpid: {}", io::Error::last_os_error());
        if Instant::now() > deadline {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("child timed out; denials so far: {denials:?}");
        }
    }
}

/// Raw system call in the sandboxed child.
fn raw(nr: c_long, a: [usize; 6]) -> isize {
    // SAFETY: the callers pass only integers or pointers to live locals.
    unsafe { sys::syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

struct Case {
    what: &'static str,
    policy: Policy,
    body: fn() -> i32,
    errno: i32,
    denied: Option<&'static str>,
}

#[test]
fn live_raw_system_calls() {
    let cases = [
        Case {
            what: "ptrace (allowed)",
            policy: DEFAULT,
            body: || {
                errno_of(raw(
                    libc::SYS_ptrace,
                    [libc::PTRACE_TRACEME as usize, 0, 0, 0, 0, 0],
                ))
            },
            errno: 0,
            denied: None,
        },
        Case {
            what: "unshare",
            policy: DEFAULT,
            body: || {
                errno_of(raw(
                    libc::SYS_unshare,
                    [libc::CLONE_NEWUSER as usize, 0, 0, 0, 0, 0],
                ))
            },
            errno: libc::EPERM,
            denied: Some("unshare"),
        },
        Case {
            what: "mount",
            policy: DEFAULT,
            body: || {
                let src = b"none\0";
                let dst = b"/tmp\0";
                let fs = b"tmpfs\0";
                errno_of(raw(
                    libc::SYS_mount,
                    [
                        src.as_ptr() as usize,
                        dst.as_ptr() as usize,
                        fs.as_ptr() as usize,
                        0,
                        0,
                        0,
                    ],
                ))
            },
            errno: libc::EPERM,
            denied: Some("mount"),
        },
        Case {
            what: "bpf",
            policy: DEFAULT,
            body: || errno_of(raw(libc::SYS_bpf, [0; 6])),
            errno: libc::EPERM,
            denied: Some("bpf"),
        },
        Case {
            what: "keyctl",
            policy: DEFAULT,
            body: || errno_of(raw(libc::SYS_keyctl, [0; 6])),
            errno: libc::EPERM,
            denied: Some("keyctl"),
        },
        Case {
            what: "socket(AF_INET) without network (the private namespace)",
            policy: DEFAULT,
            body: || {
                errno_of(raw(
                    libc::SYS_socket,
                    [
                        libc::AF_INET as usize,
                        libc::SOCK_STREAM as usize,
                        0,
                        0,
                        0,
                        0,
                    ],
                ))
            },
            errno: 0,
            denied: None,
        },
        Case {
            what: "socket(AF_NETLINK, NETLINK_ROUTE) without network",
            policy: DEFAULT,
            body: || {
                errno_of(raw(
                    libc::SYS_socket,
                    [
                        libc::AF_NETLINK as usize,
                        libc::SOCK_RAW as usize,
                        libc::NETLINK_ROUTE as usize,
                        0,
                        0,
                        0,
                    ],
                ))
            },
            errno: 0,
            denied: None,
        },
        Case {
            what: "socket(AF_NETLINK, NETLINK_NETFILTER) without network",
            policy: DEFAULT,
            body: || {
                errno_of(raw(
                    libc::SYS_socket,
                    [
                        libc::AF_NETLINK as usize,
                        libc::SOCK_RAW as usize,
                        libc::NETLINK_NETFILTER as usize,
                        0,
                        0,
                        0,
                    ],
                ))
            },
            errno: libc::EPROTONOSUPPORT,
            denied: Some("socket"),
        },
        Case {
            what: "socket(AF_NETLINK, NETLINK_AUDIT) without network (plain)",
            policy: DEFAULT,
            body: || {
                errno_of(raw(
                    libc::SYS_socket,
                    [
                        libc::AF_NETLINK as usize,
                        libc::SOCK_RAW as usize,
                        libc::NETLINK_AUDIT as usize,
                        0,
                        0,
                        0,
                    ],
                ))
            },
            errno: libc::EPROTONOSUPPORT,
            denied: None,
        },
        Case {
            what: "socket(AF_INET) with network",
            policy: NETWORK,
            body: || {
                errno_of(raw(
                    libc::SYS_socket,
                    [
                        libc::AF_INET as usize,
                        libc::SOCK_STREAM as usize,
                        0,
                        0,
                        0,
                        0,
                    ],
                ))
            },
            errno: 0,
            denied: None,
        },
        Case {
            what: "socket(AF_PACKET) with network",
            policy: NETWORK,
            body: || {
                errno_of(raw(
                    libc::SYS_socket,
                    [
                        libc::AF_PACKET as usize,
                        libc::SOCK_RAW as usize,
                        0,
                        0,
                        0,
                        0,
                    ],
                ))
            },
            errno: libc::EAFNOSUPPORT,
            denied: Some("socket"),
        },
        Case {
            what: "socketpair(AF_UNIX)",
            policy: DEFAULT,
            body: || {
                let mut sv = [0 as c_int; 2];
                errno_of(raw(
                    libc::SYS_socketpair,
                    [
                        libc::AF_UNIX as usize,
                        libc::SOCK_STREAM as usize,
                        0,
                        sv.as_mut_ptr() as usize,
                        0,
                        0,
                    ],
                ))
            },
            errno: 0,
            denied: None,
        },
        Case {
            what: "ioctl(TIOCSTI)",
            policy: DEFAULT,
            body: || {
                let c = b'x';
                errno_of(raw(
                    libc::SYS_ioctl,
                    [0, libc::TIOCSTI as usize, &c as *const u8 as usize, 0, 0, 0],
                ))
            },
            errno: libc::EPERM,
            denied: Some("ioctl"),
        },
        Case {
            what: "ioctl(TCGETS) on a bad fd",
            policy: DEFAULT,
            body: || {
                errno_of(raw(
                    libc::SYS_ioctl,
                    [9999, libc::TCGETS as usize, 0, 0, 0, 0],
                ))
            },
            errno: libc::EBADF,
            denied: None,
        },
        Case {
            what: "clone(CLONE_NEWUSER)",
            policy: DEFAULT,
            body: || {
                let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as usize;
                match raw(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]) {
                    0 => raw_exit(0), // in a grandchild: the filter let it through
                    r if r > 0 => 99,
                    r => errno_of(r),
                }
            },
            errno: libc::EPERM,
            denied: Some("clone"),
        },
        Case {
            what: "clone3",
            policy: DEFAULT,
            body: || errno_of(raw(libc::SYS_clone3, [0, 0, 0, 0, 0, 0])),
            errno: libc::ENOSYS,
            denied: None,
        },
        Case {
            what: "personality(PER_LINUX32)",
            policy: DEFAULT,
            body: || errno_of(raw(libc::SYS_personality, [8, 0, 0, 0, 0, 0])),
            errno: libc::EPERM,
            denied: Some("personality"),
        },
        Case {
            what: "personality query",
            policy: DEFAULT,
            body: || errno_of(raw(libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0])),
            errno: 0,
            denied: None,
        },
        Case {
            what: "unknown number",
            policy: DEFAULT,
            body: || errno_of(raw(1000, [0; 6])),
            errno: libc::ENOSYS,
            denied: Some("syscall_1000"),
        },
        Case {
            what: "memfd_secret (known, unlisted)",
            policy: DEFAULT,
            body: || errno_of(raw(libc::SYS_memfd_secret, [0; 6])),
            errno: libc::ENOSYS,
            denied: Some("memfd_secret"),
        },
        Case {
            what: "statmount (plain ENOSYS, unreported)",
            policy: DEFAULT,
            body: || errno_of(raw(nr::SYS_statmount, [0; 6])),
            errno: libc::ENOSYS,
            denied: None,
        },
        Case {
            what: "syslog (plain EPERM, unreported)",
            policy: DEFAULT,
            body: || errno_of(raw(libc::SYS_syslog, [3, 0, 0, 0, 0, 0])),
            errno: libc::EPERM,
            denied: None,
        },
    ];
    for case in &cases {
        let out = sandboxed(case.policy, case.body);
        assert_eq!(
            out.exit_code(),
            case.errno,
            "{}: errno (denials {:?})",
            case.what,
            out.denials
        );
        match case.denied {
            None => assert!(out.denials.is_empty(), "{}: {:?}", case.what, out.denials),
            Some(name) => {
                assert_eq!(out.denials.len(), 1, "{}: {:?}", case.what, out.denials);
                let d = &out.denials[0];
                assert_eq!(d.name, name, "{}", case.what);
                assert_eq!(d.errno, case.errno, "{}", case.what);
            }
        }
    }
}

#[test]
fn closed_listener_fails_calls_with_enosys() {
    let filter = Filter::compile(&DEFAULT);
    // SAFETY: the child only makes raw system calls.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        if raw(
            libc::SYS_prctl,
            [libc::PR_SET_NO_NEW_PRIVS as usize, 1, 0, 0, 0, 0],
        ) != 0
        {
            raw_exit(200);
        }
        // SAFETY: single-threaded child with no_new_privs set.
        let Ok(listener) = (unsafe { filter.install() }) else {
            raw_exit(201)
        };
        raw(libc::SYS_close, [listener as usize, 0, 0, 0, 0, 0]);
        raw_exit(errno_of(raw(libc::SYS_bpf, [0; 6])));
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(libc::WEXITSTATUS(status), libc::ENOSYS);
}

#[test]
fn live_denial_carries_arguments() {
    let out = sandboxed(DEFAULT, || {
        errno_of(raw(
            libc::SYS_socket,
            [
                libc::AF_PACKET as usize,
                libc::SOCK_DGRAM as usize,
                17,
                0,
                0,
                0,
            ],
        ))
    });
    assert_eq!(out.exit_code(), libc::EAFNOSUPPORT);
    assert_eq!(
        out.denials,
        vec![Denial {
            nr: libc::SYS_socket,
            name: "socket".into(),
            args: [libc::AF_PACKET as u64, libc::SOCK_DGRAM as u64, 17, 0, 0, 0],
            errno: libc::EAFNOSUPPORT,
        }]
    );
}
