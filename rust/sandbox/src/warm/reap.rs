//! In the interpreter, once a run is forked: reaping its children, killing its init and
//! reporting its exit to the supervisor (`report_exit`).

use std::os::fd::{AsRawFd, RawFd};

use crate::fdpass;
use crate::supervise::Exit;

/// In the interpreter, once the run is forked: reaps its children as they end until the
/// supervisor asks for the exit report (see `wait_exit`), then kills the run's init (`init`:
/// the kernel then kills whatever else is left in the run's pid namespace), reaps every child
/// left until the init is gone, sends the run's (`pid`) wait status and resource usage, and
/// waits for the supervisor's release (see `release`).
///
/// The run and its init are not the interpreter's only children: a process of the run that
/// calls `clone(CLONE_PARENT)` (or `vfork`/`clone` with that flag, from the run or from such
/// a child) makes a child of the run's parent, the interpreter, inside the run's pid
/// namespace. The kernel's teardown of a pid namespace (its init's exit) waits until every
/// process of it has been reaped, so a `wait4` on the init alone would wait forever for the
/// interpreter to reap such a child: every child is reaped here, by `wait4(-1)`, and told
/// apart by pid (the run's and the init's pids are theirs until they are reaped). During the
/// run a `SIGCHLD` signalfd wakes the interpreter to reap them as they end, as the init of a
/// cold run does, so that their zombies do not count against the run's pids limit.
///
/// Nothing here allocates: until the release, the run's files may still fill the slot's
/// memory, and an allocation would get the interpreter itself OOM-killed.
pub(super) fn report_exit(
    ctl: std::os::fd::BorrowedFd<'_>,
    pid: libc::pid_t,
    init: libc::pid_t,
) -> std::io::Result<()> {
    let gone = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the supervisor is gone");
    let mut children = Children {
        run: pid,
        init,
        run_exit: None,
        init_reaped: false,
    };
    let sigchld = ChildSignals::new();
    loop {
        children.reap(libc::WNOHANG);
        let mut p = [
            libc::pollfd {
                fd: ctl.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sigchld.fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Without a signalfd (it could not be made), children are reaped every 100 ms.
        let timeout = if sigchld.fd < 0 { 100 } else { -1 };
        // SAFETY: poll on two valid pollfd (a negative fd is ignored).
        unsafe { libc::poll(p.as_mut_ptr(), 2, timeout) };
        if p[0].revents != 0 {
            break;
        }
        sigchld.drain();
    }
    fdpass::recv_byte(ctl)?.ok_or_else(gone)?;
    if !children.init_reaped {
        // SAFETY: SIGKILL to our own child, not yet reaped (so its pid is still its own).
        unsafe { libc::kill(init, libc::SIGKILL) };
    }
    while !children.init_reaped && children.reap(0) {}
    drop(sigchld);
    let exit = children.run_exit.unwrap_or(Exit {
        // Not reaped by the time its pid namespace was gone (cannot happen): it was killed
        // with it.
        wait_status: libc::SIGKILL,
        // SAFETY: rusage is plain old data; all-zero is valid.
        rusage: unsafe { std::mem::zeroed() },
    });
    let secs = |t: &libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let mut m = [0u8; 29];
    m[0] = b'S';
    m[1..5].copy_from_slice(&exit.wait_status.to_le_bytes());
    m[5..13].copy_from_slice(&secs(&exit.rusage.ru_utime).to_le_bytes());
    m[13..21].copy_from_slice(&secs(&exit.rusage.ru_stime).to_le_bytes());
    #[allow(clippy::unnecessary_cast)] // c_long: i64 on 64-bit targets only
    m[21..29].copy_from_slice(&(exit.rusage.ru_maxrss as i64).to_le_bytes());
    fdpass::send(ctl, &m, &[])?;
    fdpass::recv_byte(ctl)?.ok_or_else(gone)?;
    Ok(())
}

/// The interpreter's children during one run: the run, its init, and any child a process of
/// the run made with `CLONE_PARENT` (see [`report_exit`]).
struct Children {
    run: libc::pid_t,
    init: libc::pid_t,
    /// How the run ended, once reaped.
    run_exit: Option<Exit>,
    init_reaped: bool,
}

impl Children {
    /// Reaps children (`flags`: `WNOHANG` to reap only those that have ended, 0 to wait for
    /// one); returns false when there is none left to wait for. Only the first child reaped
    /// with the run's pid is the run: until it is reaped no other process has that pid.
    fn reap(&mut self, flags: libc::c_int) -> bool {
        loop {
            let mut status = 0;
            // SAFETY: rusage is plain old data; all-zero is valid.
            let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 for any of our children, with valid out pointers.
            let r = unsafe { libc::wait4(-1, &mut status, libc::__WALL | flags, &mut rusage) };
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return false;
            }
            if r == 0 {
                return true;
            }
            if r == self.run && self.run_exit.is_none() {
                self.run_exit = Some(Exit {
                    wait_status: status,
                    rusage,
                });
            } else if r == self.init {
                self.init_reaped = true;
            }
            if flags & libc::WNOHANG == 0 {
                return true;
            }
        }
    }
}

/// `SIGCHLD` blocked in the interpreter's (only) thread and read from a signalfd, for the
/// length of one run; the mask is restored when dropped. `fd` is -1 where it could not be
/// made (the caller then polls).
struct ChildSignals {
    fd: RawFd,
    /// The mask before, where `SIGCHLD` was blocked here.
    old: Option<libc::sigset_t>,
}

impl ChildSignals {
    fn new() -> ChildSignals {
        // SAFETY: sigset_t is plain old data; the sigset calls fill valid sets; the mask is
        // this thread's own, and the signalfd a new fd owned by the returned value.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                return ChildSignals { fd: -1, old: None };
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
            ChildSignals { fd, old: Some(old) }
        }
    }

    /// Reads the pending `SIGCHLD`s (one per batch of ended children, at least).
    fn drain(&self) {
        if self.fd < 0 {
            return;
        }
        let mut buf = [0u8; 128 * 8];
        // SAFETY: reading into a valid buffer from our own non-blocking signalfd.
        while unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }
}

impl Drop for ChildSignals {
    fn drop(&mut self) {
        self.drain();
        // SAFETY: closing our own fd; restoring this thread's mask from a valid set. A
        // SIGCHLD left pending is then delivered with its default action (ignored).
        unsafe {
            if self.fd >= 0 {
                libc::close(self.fd);
            }
            if let Some(old) = &self.old {
                libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
            }
        }
    }
}
