//! The host side: starting a slot's warm interpreter ([`WarmInterpreter`]) in a box of the slot, asking
//! it for runs over its control socket and collecting their exits.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use super::wire::encode;
use crate::fdpass;
use crate::mounts::{RunFs, BOX_ID};
use crate::run::{self, BoxSpec, Cause, ChildFds, Launch};
use crate::sandbox::{Prepared, Shared, Slot};
use crate::spawn::Step;
use crate::supervise::{self, Exit};

/// The largest request (its environment, mostly) the control socket is sized for: more than
/// `execve` takes (its arguments and environment share a quarter of the stack limit).
const MAX_REQUEST: usize = 8 << 20;

/// A slot's warm interpreter.
pub struct WarmInterpreter {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    ctl: OwnedFd,
    /// Memory the interpreter itself holds in the slot cgroup.
    pub baseline_memory: u64,
    /// Its stdout and stderr (a memfd), for error messages.
    log: OwnedFd,
}

impl Drop for WarmInterpreter {
    fn drop(&mut self) {
        run::kill(self.pidfd.as_fd());
        supervise::reap(self.pid);
    }
}

/// Whether the interpreter is still running.
pub(crate) fn is_alive(z: &WarmInterpreter) -> bool {
    let mut p = libc::pollfd {
        fd: z.pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 0 }
}

/// Makes sure the slot has a live warm interpreter.
pub(crate) fn ensure(shared: &Shared, slot: &mut Slot) -> Result<(), Cause> {
    if slot.interpreter.as_ref().is_some_and(is_alive) {
        return Ok(());
    }
    slot.interpreter = None;
    let z = start(shared, slot)?;
    slot.interpreter = Some(z);
    Ok(())
}

/// Kills and forgets the slot's warm interpreter (after it misbehaved).
pub(crate) fn discard(slot: &mut Slot) {
    slot.interpreter = None;
}

fn start(shared: &Shared, slot: &mut Slot) -> Result<WarmInterpreter, Cause> {
    let warm = shared
        .config
        .warm
        .as_ref()
        .ok_or("no warm interpreter configured")?;
    let e = |what: &'static str| {
        move |err: std::io::Error| format!("starting the warm interpreter: {what}: {err}")
    };
    let runfs = RunFs::new(1 << 20, slot.host_id, slot.host_id, &[]).map_err(e("tmpfs"))?;
    let stdin = run::memfd_with(b"").map_err(e("stdin"))?;
    let log = run::memfd_with(b"").map_err(e("log"))?;
    let (status_r, status_w) = run::pipe().map_err(e("pipe"))?;
    let (_sock_parent, sock_child) = fdpass::seqpacket_pair().map_err(e("socketpair"))?;
    let (ctl, ctl_child) = fdpass::seqpacket_pair().map_err(e("socketpair"))?;
    // A request carries the run's environment, which may be as large as `execve` takes.
    fdpass::set_send_buffer(ctl.as_fd(), MAX_REQUEST);
    let argv: Vec<CString> = warm
        .argv
        .iter()
        .map(|a| {
            CString::new(a.as_bytes()).map_err(|_| "warm interpreter argv contains NUL".to_string())
        })
        .collect::<Result<_, String>>()?;
    let cwd = CString::new("/").expect("no NUL");
    // No core dump and no host core handler, ever (see `crate::rlimit`): the interpreter's
    // hard limit of 1 is also the most any of its runs can have.
    crate::rlimit::allow_no_core();
    let rlimits = [(
        #[allow(clippy::unnecessary_cast)] // u32 on glibc, c_int elsewhere
        (libc::RLIMIT_CORE as u32),
        crate::rlimit::NO_CORE,
    )];
    let spec = BoxSpec {
        argv: &argv,
        exec_paths: &argv[..1],
        env: &shared.base_env,
        cwd: &cwd,
        rlimits: &rlimits,
        id_map: format!("0 {} 1\n{BOX_ID} {} 1\n", slot.warm_host_id, slot.host_id),
        warm_control: Some(ctl_child.as_fd()),
        work_mount: None,
        owner: slot.host_id,
        cgroup: slot.cgroup.as_ref(),
    };
    let fds = ChildFds {
        run_mount: runfs.mount.as_fd(),
        stdin: stdin.as_fd(),
        stdout: log.as_fd(),
        stderr: log.as_fd(),
        listener_sock: sock_child.as_fd(),
    };
    let launched = run::clone_box(shared, slot, &spec, &fds, (status_r.as_fd(), status_w))?;
    drop(ctl_child);
    let (pid, pidfd) = match launched {
        Ok(p) => p,
        Err((_, errno)) => {
            return Err(format!(
                "starting the warm interpreter: cannot execute {}: {}",
                warm.argv[0],
                std::io::Error::from_raw_os_error(errno)
            )
            .into())
        }
    };
    let mut z = WarmInterpreter {
        pid,
        pidfd,
        ctl,
        log,
        baseline_memory: 0,
    };
    match fdpass::recv(z.ctl.as_fd(), Some(warm.start_timeout)) {
        Ok(Some((m, _))) if m == b"R" => {}
        other => {
            let why = match other {
                Err(e) => e.to_string(),
                Ok(_) => "it exited".to_string(),
            };
            // Killing it first makes sure its output is complete.
            run::kill(z.pidfd.as_fd());
            supervise::reap(z.pid);
            let out = tail(&z.log);
            return Err(
                format!("the warm interpreter did not start ({why}); its output: {out}").into(),
            );
        }
    }
    // The interpreter lives in the slot's cgroup, like its runs (no per-run migration: that
    // would cost an RCU grace period each). What it holds there is the slot's baseline,
    // added to each run's memory limit and taken off its peak.
    if let Some(cg) = &slot.cgroup {
        z.baseline_memory = cg.sample_memory().unwrap_or(0);
    }
    Ok(z)
}

/// The last few hundred bytes of a memfd, for error messages.
fn tail(fd: &OwnedFd) -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: pread into a valid buffer from a valid fd.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    buf.truncate(n.max(0) as usize);
    let s = String::from_utf8_lossy(&buf);
    let s = s.trim();
    let mut cut = s.len().saturating_sub(600);
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    s[cut..].to_string()
}

/// Asks the warm interpreter for a run; returns once the run is about to execute user code.
pub(crate) fn launch(
    shared: &Shared,
    slot: &mut Slot,
    prepared: &Prepared,
    fds: &ChildFds<'_>,
    (status_r, status_w): (std::os::fd::BorrowedFd<'_>, OwnedFd),
    sock_parent: std::os::fd::BorrowedFd<'_>,
) -> Result<Launch, Cause> {
    let (go_r, go_w) = run::pipe().map_err(Cause::io("pipe"))?;
    let rlimits = crate::rlimit::for_limits(&prepared.limits, slot.cgroup.is_none());
    let payload = encode(
        shared.config.network,
        &rlimits,
        prepared.cwd.as_bytes(),
        &prepared.env,
    );
    let mut send = vec![
        fds.run_mount.as_raw_fd(),
        fds.stdin.as_raw_fd(),
        fds.stdout.as_raw_fd(),
        fds.stderr.as_raw_fd(),
        status_w.as_raw_fd(),
        fds.listener_sock.as_raw_fd(),
        go_r.as_raw_fd(),
    ];
    let passed = std::mem::take(&mut *prepared.pass_fds.lock().unwrap_or_else(|e| e.into_inner()));
    send.extend(passed.iter().map(|f| f.as_raw_fd()));
    // An interpreter that died between runs (found gone when asked, or gone before it forked)
    // ran none of this run's code: a new one is started and asked again, once, so that the
    // program gets its own verdict rather than `sandbox_error`. Once the interpreter has
    // answered `P`, the run exists and is never started twice.
    let mut attempts = 0;
    let (pidfd, initfd) = loop {
        attempts += 1;
        let z = slot.interpreter.as_ref().ok_or("no warm interpreter")?;
        let gone = match fdpass::send(z.ctl.as_fd(), &payload, &send) {
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                return Err(format!(
                    "the run's environment is too large for the warm interpreter ({} bytes)",
                    payload.len()
                )
                .into())
            }
            Err(e) => format!("the warm interpreter is gone: {e}"),
            Ok(()) => match fdpass::recv(z.ctl.as_fd(), Some(Duration::from_secs(30))) {
                Ok(Some((m, mut f))) if m == b"P" && f.len() == 2 => {
                    let init = f.pop().expect("two fds");
                    break (f.pop().expect("two fds"), init);
                }
                Ok(Some((m, _))) if m.first() == Some(&b'E') => {
                    return Err(format!(
                        "the warm interpreter could not fork: {}",
                        String::from_utf8_lossy(&m[1..])
                    )
                    .into())
                }
                Ok(_) => format!("the warm interpreter died; its output: {}", tail(&z.log)),
                Err(e) => return Err(format!("the warm interpreter did not answer: {e}").into()),
            },
        };
        if attempts > 1 {
            return Err(gone.into());
        }
        discard(slot);
        ensure(shared, slot).map_err(|e| format!("{gone}; a new one did not start: {e}"))?;
    };
    drop(status_w);
    drop(go_r);
    // The interpreter has its copies: ours go now.
    drop(passed);
    // Let it run.
    // SAFETY: writing one byte from a valid buffer to our pipe.
    if unsafe { libc::write(go_w.as_raw_fd(), b"g".as_ptr().cast(), 1) } != 1 {
        run::kill(initfd.as_fd());
        finish(slot);
        return Err(Cause::io("releasing the warm run")(
            std::io::Error::last_os_error(),
        ));
    }
    drop(go_w);
    match run::read_status(status_r, Duration::from_secs(30)) {
        Ok(None) => {}
        Ok(Some((Step::Chdir, errno))) => {
            finish(slot);
            return Ok(Launch::ExecFailed(Step::Chdir, errno));
        }
        Ok(Some((step, errno))) => {
            finish(slot);
            return Err(format!(
                "warm run set-up failed at {}: {}",
                step.describe(),
                std::io::Error::from_raw_os_error(errno)
            )
            .into());
        }
        Err(e) => {
            run::kill(initfd.as_fd());
            finish(slot);
            return Err(e);
        }
    }
    let listener = match run::receive_listener(sock_parent) {
        Ok(l) => l,
        Err(e) => {
            run::kill(initfd.as_fd());
            finish(slot);
            return Err(e);
        }
    };
    Ok(Launch::Live(run::Live {
        mnt_ns: None,
        pidfd,
        kill: Some(initfd),
        reaper: run::Reaper::WarmInterpreter,
        listener,
    }))
}

/// A run that ended during its set-up: collects its exit and releases the interpreter.
fn finish(slot: &mut Slot) {
    if wait_exit(slot).is_err() || release(slot).is_err() {
        discard(slot);
    }
}

/// Lets the interpreter go on once the run's file system is freed (see [`report_exit`](super::reap::report_exit)).
pub(crate) fn release(slot: &Slot) -> Result<(), Cause> {
    let z = slot.interpreter.as_ref().ok_or("no warm interpreter")?;
    fdpass::send(z.ctl.as_fd(), b"!", &[])
        .map_err(|e| format!("the warm interpreter is gone: {e}").into())
}

/// Receives the exit report of the run in flight from the warm interpreter: once it comes,
/// every process of the run is gone. The interpreter then waits for [`release`], allocating
/// nothing: a run that filled the slot's memory (with tmpfs pages, say) leaves it full until
/// the supervisor has freed the run's file system, and an allocation before that would get
/// the interpreter itself OOM-killed.
pub(crate) fn wait_exit(slot: &Slot) -> Result<Exit, Cause> {
    let z = slot.interpreter.as_ref().ok_or("no warm interpreter")?;
    fdpass::send(z.ctl.as_fd(), b"?", &[])
        .map_err(|e| format!("the warm interpreter is gone: {e}"))?;
    match fdpass::recv(z.ctl.as_fd(), Some(Duration::from_secs(30))) {
        Ok(Some((m, _))) if m.len() == 29 && m[0] == b'S' => {
            let status = i32::from_le_bytes(m[1..5].try_into().expect("4 bytes"));
            let utime = f64::from_le_bytes(m[5..13].try_into().expect("8 bytes"));
            let stime = f64::from_le_bytes(m[13..21].try_into().expect("8 bytes"));
            let maxrss = i64::from_le_bytes(m[21..29].try_into().expect("8 bytes"));
            // SAFETY: rusage is plain old data; all-zero is valid.
            let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
            rusage.ru_utime = timeval(utime);
            rusage.ru_stime = timeval(stime);
            rusage.ru_maxrss = maxrss;
            Ok(Exit {
                wait_status: status,
                rusage,
            })
        }
        Ok(_) => Err(format!(
            "the warm interpreter died during the run; its output: {}",
            tail(&z.log)
        )
        .into()),
        Err(e) => Err(format!("the warm interpreter did not report the exit: {e}").into()),
    }
}

fn timeval(s: f64) -> libc::timeval {
    libc::timeval {
        tv_sec: s.trunc() as libc::time_t,
        tv_usec: (s.fract() * 1e6) as libc::suseconds_t,
    }
}
