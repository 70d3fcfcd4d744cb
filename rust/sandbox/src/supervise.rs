//! Watching a live box: output capture, seccomp notifications, wall-clock and CPU limits.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::seccomp;

/// One captured stream: kept up to `cap` bytes, the rest drained and counted.
pub struct Capture {
    pub fd: Option<OwnedFd>,
    pub data: Vec<u8>,
    pub total: u64,
    cap: u64,
    /// Where a copy of what is kept goes as it is read (live output), if anywhere.
    pub tee: Option<crate::tee::TeeSender>,
}

impl Capture {
    pub fn new(fd: OwnedFd, cap: u64) -> Capture {
        Capture {
            fd: Some(fd),
            data: Vec::new(),
            total: 0,
            cap,
            tee: None,
        }
    }

    pub fn truncated(&self) -> bool {
        self.total > self.cap
    }

    /// Past the cap, output is drained and discarded (a writer is never blocked), but only up
    /// to four times the cap plus 1 MiB: beyond that the program is flooding, and the box is
    /// stopped with `output_limit` instead of burning its whole time limit.
    pub fn flooded(&self) -> bool {
        self.total > self.cap.saturating_mul(4).saturating_add(1 << 20)
    }

    /// Reads what is available; closes the fd at end of file.
    fn pump(&mut self, buf: &mut [u8]) {
        let Some(fd) = &self.fd else { return };
        loop {
            // SAFETY: buf is valid for its length; fd is an open pipe read end.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                let n = n as usize;
                let room = (self.cap.saturating_sub(self.data.len() as u64)) as usize;
                let kept = &buf[..n.min(room)];
                if let Some(t) = &self.tee {
                    t.send(kept);
                }
                self.data.extend_from_slice(kept);
                self.total += n as u64;
                continue;
            }
            if n == 0 {
                self.fd = None;
                return;
            }
            let e = std::io::Error::last_os_error().raw_os_error();
            if e == Some(libc::EINTR) {
                continue;
            }
            if e != Some(libc::EAGAIN) {
                self.fd = None;
            }
            return;
        }
    }
}

/// Why the supervisor killed the box, if it did (defined with the verdict it feeds).
pub use crate::verdict::Kill;

/// What the watch loop saw.
pub struct Watch {
    pub killed: Option<Kill>,
    pub denied: Vec<String>,
}

const MAX_DENIALS: usize = 64;

/// Parameters of the watch loop.
pub struct Params<'a> {
    /// The box's process whose exit ends the run.
    pub pidfd: BorrowedFd<'a>,
    /// The process whose death kills the whole box: its pid 1 (the same as `pidfd` for a
    /// cold run; the idle init of a warm one, which is killed once the program has exited).
    pub kill: BorrowedFd<'a>,
    pub listener: Option<BorrowedFd<'a>>,
    pub deadline: Instant,
    pub cpu_limit_ns: u64,
    /// Reads the box's CPU time so far; `None` where it cannot be read.
    pub cpu_time: &'a dyn Fn() -> Option<u64>,
    /// Set by another thread to stop the run (see `RunRequest::cancel`).
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
}

/// Runs until the box's program ends (`pidfd` becomes readable), then kills the box (`kill`)
/// and drains the pipes. Reaping is the caller's: the box may be our child or the warm interpreter's.
pub fn watch(p: Params<'_>, out: &mut Capture, err: &mut Capture) -> Watch {
    let mut buf = vec![0u8; 64 << 10];
    let mut killed = None;
    let mut denied: Vec<String> = Vec::new();
    let cpu_poll = Duration::from_millis(10);
    let kill = |pidfd: BorrowedFd<'_>| {
        // SAFETY: pidfd_send_signal on our own pidfd; no pointers besides NULL siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<u8>(),
                0,
            )
        };
    };
    let mut exited = false;
    let mut listener = p.listener;
    while !exited {
        let now = Instant::now();
        if killed.is_none()
            && p.cancel
                .is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst))
        {
            kill(p.kill);
            killed = Some(Kill::Cancelled);
        }
        if killed.is_none() {
            if out.flooded() || err.flooded() {
                kill(p.kill);
                killed = Some(Kill::Output);
            } else if now >= p.deadline {
                kill(p.kill);
                killed = Some(Kill::WallTime);
            } else if let Some(ns) = (p.cpu_time)() {
                if ns >= p.cpu_limit_ns {
                    kill(p.kill);
                    killed = Some(Kill::CpuTime);
                }
            }
        }
        let mut timeout = if killed.is_some() {
            Duration::from_millis(100)
        } else {
            p.deadline.saturating_duration_since(now)
        };
        timeout = timeout.min(cpu_poll);
        let mut fds = [
            pfd(Some(p.pidfd.as_raw_fd())),
            pfd(out.fd.as_ref().map(|f| f.as_raw_fd())),
            pfd(err.fd.as_ref().map(|f| f.as_raw_fd())),
            pfd(listener.map(|f| f.as_raw_fd())),
        ];
        let ms = timeout.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: fds is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            continue;
        }
        if fds[1].revents != 0 {
            out.pump(&mut buf);
        }
        if fds[2].revents != 0 {
            err.pump(&mut buf);
        }
        if fds[3].revents & libc::POLLIN == 0 && fds[3].revents != 0 {
            // Hang-up: no task uses the filter any more; nothing else will arrive.
            listener = None;
        } else if fds[3].revents & libc::POLLIN != 0 {
            if let Some(l) = listener {
                if let Ok(Some(d)) = seccomp::answer_notification(l) {
                    if denied.len() < MAX_DENIALS && !denied.contains(&d.name) {
                        denied.push(d.name);
                    }
                }
            }
        }
        if fds[0].revents != 0 {
            exited = true;
            // Whatever the program left behind dies with the box's pid 1.
            kill(p.kill);
        }
    }
    // The box's pid 1 is gone or going, so the kernel kills every other process of the pid
    // namespace: the pipes reach end of file once their buffers are drained.
    let drain_until = Instant::now() + Duration::from_secs(2);
    while (out.fd.is_some() || err.fd.is_some()) && Instant::now() < drain_until {
        let mut fds = [
            pfd(out.fd.as_ref().map(|f| f.as_raw_fd())),
            pfd(err.fd.as_ref().map(|f| f.as_raw_fd())),
        ];
        // SAFETY: fds is a valid array of two pollfd.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
        out.pump(&mut buf);
        err.pump(&mut buf);
    }
    out.fd = None;
    err.fd = None;
    Watch { killed, denied }
}

/// How the box's init process ended, and what it used.
pub struct Exit {
    pub wait_status: i32,
    pub rusage: libc::rusage,
}

/// Reaps our own child `pid` (cloned without an exit signal, hence `__WALL`).
pub fn reap(pid: libc::pid_t) -> Exit {
    let mut status = 0;
    // SAFETY: rusage is plain old data; all-zero is valid.
    let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child with valid out pointers.
        let r = unsafe { libc::wait4(pid, &mut status, libc::__WALL, &mut rusage) };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    Exit {
        wait_status: status,
        rusage,
    }
}

fn pfd(fd: Option<i32>) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    }
}
