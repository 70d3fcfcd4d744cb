//! The warm-interpreter fast path ("zygote").
//!
//! Python start-up costs tens of milliseconds, far more than isolation. Each slot can keep a
//! **warm interpreter**: a Python process that was started once inside a box of the slot (its
//! own user, mount, pid, ipc, uts and cgroup namespaces, the slot's network namespace, the
//! read-only root) and has already imported the configured modules. It is trusted code (the
//! bootstrap in `python/agentrl/_warm.py`): it runs as root *of its user namespace* (an
//! unprivileged host uid of its own), without seccomp, so that it can build nested
//! namespaces for its children.
//!
//! A warm run is a `fork` of that interpreter, made by the interpreter on request over a
//! control socket, into a **new pid namespace**. Its pid 1 is a tiny idle init (see
//! [`crate::init`]) that the interpreter starts first with a `clone(CLONE_VM | CLONE_VFORK)`
//! and `execve`, which copies none of its memory; the run is pid 2 (so its own signals behave
//! as anywhere else), the one fork per run. It cannot see, signal or trace the interpreter or
//! any other run; its parent is the interpreter, outside its namespace, so `getppid()` reads
//! 0 there. The run enters a **new mount namespace**, where it
//! attaches a fresh per-run tmpfs over `/work`, `/tmp` and `/dev/shm` and mounts its
//! own `/proc` (with `/proc/sys` read-only) and its own `/dev/pts`. It then drops to the box user (uid 1000, a
//! different host uid from the interpreter's), clears every capability, sets
//! `no_new_privs`, installs the same seccomp filter as a cold run, hands the listener to the
//! supervisor, closes every fd but 0/1/2 and only then runs the user's code. The modules the
//! run imports and everything it changes die with it: the next run is a fresh fork.
//!
//! Each run also has an **IPC namespace** of its own (SysV shared memory, semaphores and
//! message queues, POSIX message queues), as a cold run has: the interpreter moves into a
//! fresh one between runs and each run inherits one no other run had (see `unshare_ipc`).
//!
//! When the program ends, the supervisor kills the init (the kernel then kills whatever the
//! program left in its namespace), and the interpreter reaps the program and the init and
//! reports the program's wait status. It reaps every other child too: a process of the run
//! that clones with `CLONE_PARENT` makes a child of the interpreter inside the run's pid
//! namespace, which the namespace's teardown waits for (see `report_exit`).
//!
//! The supervisor (the slot thread) kills a run through a pidfd the interpreter sends it, and
//! the interpreter reports the exit status. If the interpreter dies, the run in flight gets
//! `sandbox_error` and the next warm run starts a new interpreter.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::fdpass;
use crate::mounts::{RunFs, BOX_ID};
use crate::run::{self, BoxSpec, ChildFds, Launch, RunResult};
use crate::sandbox::{Prepared, Shared, Slot};
use crate::seccomp::{self, Filter, Policy};
use crate::spawn::{ChildStack, KernelSigaction, Step};
use crate::supervise::{self, Exit};
use crate::sys::{syscall3, syscall6};

/// The largest request (its environment, mostly) the control socket is sized for: more than
/// `execve` takes (its arguments and environment share a quarter of the stack limit).
const MAX_REQUEST: usize = 8 << 20;

/// Where the extension module is bound inside the box (the bootstrap loads it from there).
pub const CORE_MODULE_IN_BOX: &str = "/.agentrl/_core.so";

/// How to start a warm interpreter.
#[derive(Debug, Clone)]
pub struct WarmConfig {
    /// The full command (`python -I -c BOOTSTRAP`), built by the Python layer.
    pub argv: Vec<String>,
    /// Host path of the compiled extension module, bound at [`CORE_MODULE_IN_BOX`].
    pub core_module: std::path::PathBuf,
    /// How long the interpreter may take to start and import its modules.
    pub start_timeout: Duration,
}

/// A slot's warm interpreter.
pub struct Zygote {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    ctl: OwnedFd,
    /// Memory the interpreter itself holds in the slot cgroup.
    pub baseline_memory: u64,
    /// Its stdout and stderr (a memfd), for error messages.
    log: OwnedFd,
}

impl Drop for Zygote {
    fn drop(&mut self) {
        run::kill(self.pidfd.as_fd());
        supervise::reap(self.pid);
    }
}

/// Whether the interpreter is still running.
pub(crate) fn is_alive(z: &Zygote) -> bool {
    let mut p = libc::pollfd {
        fd: z.pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 0 }
}

/// Makes sure the slot has a live warm interpreter.
pub(crate) fn ensure(shared: &Shared, slot: &mut Slot) -> RunResult<()> {
    if slot.zygote.as_ref().is_some_and(is_alive) {
        return Ok(());
    }
    slot.zygote = None;
    let z = start(shared, slot)?;
    slot.zygote = Some(z);
    Ok(())
}

/// Kills and forgets the slot's warm interpreter (after it misbehaved).
pub(crate) fn discard(slot: &mut Slot) {
    slot.zygote = None;
}

fn start(shared: &Shared, slot: &mut Slot) -> RunResult<Zygote> {
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
        .collect::<RunResult<_>>()?;
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
        id_map: format!("0 {} 1\n{BOX_ID} {} 1\n", slot.zygote_host_id, slot.host_id),
        zygote_control: Some(ctl_child.as_fd()),
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
            ))
        }
    };
    let mut z = Zygote {
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
            return Err(format!(
                "the warm interpreter did not start ({why}); its output: {out}"
            ));
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
) -> RunResult<Launch> {
    let (go_r, go_w) = run::pipe().map_err(|e| format!("pipe: {e}"))?;
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
        let z = slot.zygote.as_ref().ok_or("no warm interpreter")?;
        let gone = match fdpass::send(z.ctl.as_fd(), &payload, &send) {
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                return Err(format!(
                    "the run's environment is too large for the warm interpreter ({} bytes)",
                    payload.len()
                ))
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
                    ))
                }
                Ok(_) => format!("the warm interpreter died; its output: {}", tail(&z.log)),
                Err(e) => return Err(format!("the warm interpreter did not answer: {e}")),
            },
        };
        if attempts > 1 {
            return Err(gone);
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
        return Err(format!(
            "releasing the warm run: {}",
            std::io::Error::last_os_error()
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
            ));
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
        reaper: run::Reaper::Zygote,
        listener,
    }))
}

/// A run that ended during its set-up: collects its exit and releases the interpreter.
fn finish(slot: &mut Slot) {
    if wait_exit(slot).is_err() || release(slot).is_err() {
        discard(slot);
    }
}

/// Lets the interpreter go on once the run's file system is freed (see [`report_exit`]).
pub(crate) fn release(slot: &Slot) -> RunResult<()> {
    let z = slot.zygote.as_ref().ok_or("no warm interpreter")?;
    fdpass::send(z.ctl.as_fd(), b"!", &[]).map_err(|e| format!("the warm interpreter is gone: {e}"))
}

/// Receives the exit report of the run in flight from the warm interpreter: once it comes,
/// every process of the run is gone. The interpreter then waits for [`release`], allocating
/// nothing: a run that filled the slot's memory (with tmpfs pages, say) leaves it full until
/// the supervisor has freed the run's file system, and an allocation before that would get
/// the interpreter itself OOM-killed.
pub(crate) fn wait_exit(slot: &Slot) -> RunResult<Exit> {
    let z = slot.zygote.as_ref().ok_or("no warm interpreter")?;
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
        )),
        Err(e) => Err(format!("the warm interpreter did not report the exit: {e}")),
    }
}

fn timeval(s: f64) -> libc::timeval {
    libc::timeval {
        tv_sec: s.trunc() as libc::time_t,
        tv_usec: (s.fract() * 1e6) as libc::suseconds_t,
    }
}

/// Serialises what the interpreter's child needs: network policy, rlimits, cwd, env.
fn encode(
    network: bool,
    rlimits: &[(u32, libc::rlimit64)],
    cwd: &[u8],
    env: &[CString],
) -> Vec<u8> {
    let mut v = vec![u8::from(network)];
    v.extend_from_slice(&(rlimits.len() as u32).to_le_bytes());
    for (r, l) in rlimits {
        v.extend_from_slice(&r.to_le_bytes());
        v.extend_from_slice(&l.rlim_cur.to_le_bytes());
        v.extend_from_slice(&l.rlim_max.to_le_bytes());
    }
    v.extend_from_slice(&(cwd.len() as u32).to_le_bytes());
    v.extend_from_slice(cwd);
    v.extend_from_slice(&encode_env(env.iter().map(|e| e.as_bytes())));
    v
}

/// The environment part of a request: a count, then each `NAME=value` with its length.
pub fn encode_env<'a>(entries: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut v = (entries.len() as u32).to_le_bytes().to_vec();
    for b in entries {
        v.extend_from_slice(&(b.len() as u32).to_le_bytes());
        v.extend_from_slice(b);
    }
    v
}

/// A run's environment, as `(name, value)` pairs in order.
pub type Env = Vec<(String, String)>;

/// A decoded request.
struct Request {
    pub network: bool,
    pub rlimits: Vec<(u32, libc::rlimit64)>,
    pub cwd: CString,
    /// `None` when the run's environment is `own_env` as given to [`decode`].
    pub env: Option<Env>,
}

/// Parses a request payload. `own_env` is the interpreter's own environment as
/// [`encode_env`] writes it: a request with that very environment decodes it as `None`
/// (nothing to build or to install, the common case).
fn decode(p: &[u8], own_env: &[u8]) -> Option<Request> {
    let mut i = 0usize;
    let take = |i: &mut usize, n: usize| -> Option<&[u8]> {
        let s = p.get(*i..*i + n)?;
        *i += n;
        Some(s)
    };
    let u32_ = |i: &mut usize| take(i, 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")));
    let u64_ = |i: &mut usize| take(i, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
    let network = *take(&mut i, 1)?.first()? != 0;
    let n = u32_(&mut i)? as usize;
    let mut rlimits = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let r = u32_(&mut i)?;
        let cur = u64_(&mut i)?;
        let max = u64_(&mut i)?;
        rlimits.push((
            r,
            libc::rlimit64 {
                rlim_cur: cur,
                rlim_max: max,
            },
        ));
    }
    let n = u32_(&mut i)? as usize;
    let cwd = CString::new(take(&mut i, n)?).ok()?;
    if p.get(i..)? == own_env {
        return Some(Request {
            network,
            rlimits,
            cwd,
            env: None,
        });
    }
    let n = u32_(&mut i)? as usize;
    let mut env = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let m = u32_(&mut i)? as usize;
        let kv = String::from_utf8(take(&mut i, m)?.to_vec()).ok()?;
        let (k, v) = kv.split_once('=')?;
        env.push((k.to_string(), v.to_string()));
    }
    (i == p.len()).then_some(Request {
        network,
        rlimits,
        cwd,
        env: Some(env),
    })
}

// ---- The interpreter's side (called through the binding inside the warm interpreter) ----

/// What the request loop needs from the interpreter it runs in.
pub trait Interpreter {
    /// Before each fork: flush buffered output, freeze the heap, and the like.
    fn before_fork(&mut self);
    /// Forks the interpreter the way its runtime requires; `Ok(0)` in the child.
    fn fork(&mut self) -> std::io::Result<libc::pid_t>;
    /// Runs a blocking wait, letting the interpreter's other threads (if any) go on.
    fn blocking<T: Send>(&mut self, f: impl FnOnce() -> T + Send) -> T;
}

/// The warm interpreter's request loop, on its control socket `ctl`. For each request it
/// starts the run's pid namespace with the idle init as pid 1 ([`spawn_init`]), forks the run
/// as pid 2, sends the supervisor the run's and the init's pidfds and then reports the run's
/// exit ([`report_exit`]). It returns in the run, once set up ([`child_setup`]), with the
/// environment to install (`None` for `own_env`, the interpreter's own as [`encode_env`]
/// writes it), its `/proc/self/cmdline` reading `<interpreter> __main__.py` ([`ShownArgs`]);
/// in the interpreter only at end of file (`Ok(None)`) or when the control socket fails.
pub fn serve(
    ctl: std::os::fd::BorrowedFd<'_>,
    interp: &mut impl Interpreter,
    own_env: &[u8],
) -> std::io::Result<Option<Option<Env>>> {
    let shown = ShownArgs::new();
    // Whether the interpreter's IPC namespace is one no run has had yet (see
    // `unshare_ipc`): made between runs, off the path of any run, and only remade on a
    // request's path if that failed.
    let mut fresh_ipc = false;
    loop {
        if !fresh_ipc {
            fresh_ipc = unshare_ipc().is_ok();
        }
        let Some((mut payload, fds)) = interp.blocking(|| receive_request(ctl))? else {
            return Ok(None);
        };
        interp.before_fork();
        let close_all = |fds: &[RawFd]| {
            for &fd in fds {
                // SAFETY: closing fds received with the request, owned by this loop.
                unsafe { libc::close(fd) };
            }
        };
        let ipc = if fresh_ipc { Ok(()) } else { unshare_ipc() };
        let forked = ipc.and_then(|()| unshare_pid()).and_then(|()| {
            let (init_pid, init_fd) = spawn_init()?;
            match interp.fork() {
                Ok(pid) => Ok((pid, init_pid, init_fd)),
                Err(e) => {
                    kill_and_reap(init_pid);
                    Err(e)
                }
            }
        });
        let (pid, init_pid, init_fd) = match forked {
            Ok(f) => f,
            Err(e) => {
                wipe(&mut payload);
                close_all(&fds);
                fdpass::send(ctl, format!("E{e}").as_bytes(), &[])?;
                continue;
            }
        };
        if pid == 0 {
            drop(init_fd);
            let env = child_setup(&payload, &fds, own_env);
            shown.install(env.as_ref());
            return Ok(Some(env));
        }
        // This run (and its init) have the namespace now: the next run gets another.
        fresh_ipc = false;
        wipe(&mut payload);
        close_all(&fds);
        // SAFETY: pidfd_open on our own child, not yet reaped.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            let e = std::io::Error::last_os_error();
            kill_and_reap(pid);
            kill_and_reap(init_pid);
            fdpass::send(ctl, format!("Epidfd_open: {e}").as_bytes(), &[])?;
            continue;
        }
        // SAFETY: a fresh pidfd, owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
        let sent = fdpass::send(ctl, b"P", &[pidfd.as_raw_fd(), init_fd.as_raw_fd()]);
        drop((pidfd, init_fd));
        sent?;
        interp.blocking(|| report_exit(ctl, pid, init_pid))?;
    }
}

/// The kernel's `struct prctl_mm_map` (`PR_SET_MM_MAP`): the addresses `/proc/PID/stat`,
/// `cmdline` and `environ` are read from.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: u64,
    auxv_size: u32,
    exe_fd: u32,
}

/// What a run's `/proc/self/cmdline` and `/proc/self/environ` show: `<interpreter>
/// __main__.py` and the run's environment, as for a cold `python __main__.py`, rather than
/// the warm interpreter's bootstrap command and its own start-up environment. Made once per
/// interpreter (the argument block lives, leaked, in the heap every run inherits); installed
/// in each run with `PR_SET_MM_MAP`, which needs no privilege when it leaves the executable
/// alone. Where that fails (a kernel without `CONFIG_CHECKPOINT_RESTORE`, a data limit below
/// the heap) the run keeps the interpreter's.
struct ShownArgs {
    /// The interpreter's memory layout, from `/proc/self/stat` (`None`: unreadable).
    map: Option<MmMap>,
    /// `argv[0]`, NUL, `__main__.py`, NUL.
    args: &'static [u8],
}

impl ShownArgs {
    fn new() -> Self {
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        let mut args = argv0.to_vec();
        args.extend_from_slice(b"\0__main__.py\0");
        let map = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| Self::parse_stat(&s));
        Self {
            map,
            args: Vec::leak(args),
        }
    }

    /// The fields of `/proc/self/stat` that `PR_SET_MM_MAP` sets (all but `brk`, which moves).
    fn parse_stat(stat: &str) -> Option<MmMap> {
        // Fields from the third on, after the command name in parentheses.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let f: Vec<u64> = rest
            .split(' ')
            .map(|x| x.trim().parse().unwrap_or(0))
            .collect();
        let field = |n: usize| f.get(n - 3).copied().filter(|&v| v != 0);
        Some(MmMap {
            start_code: field(26)?,
            end_code: field(27)?,
            start_stack: field(28)?,
            start_data: field(45)?,
            end_data: field(46)?,
            start_brk: field(47)?,
            arg_start: field(48)?,
            arg_end: field(49)?,
            env_start: field(50)?,
            env_end: field(51)?,
            exe_fd: u32::MAX,
            ..MmMap::default()
        })
    }

    /// In the run: points the argument block at `args` and, when the run's environment is not
    /// the interpreter's (`env`), the environment block at a copy of it. Best effort.
    fn install(&self, env: Option<&Env>) {
        let Some(mut map) = self.map else { return };
        map.arg_start = self.args.as_ptr() as u64;
        map.arg_end = map.arg_start + self.args.len() as u64;
        if let Some(env) = env {
            let mut block = Vec::new();
            for (k, v) in env {
                block.extend_from_slice(k.as_bytes());
                block.push(b'=');
                block.extend_from_slice(v.as_bytes());
                block.push(0);
            }
            if !block.is_empty() {
                let block = Vec::leak(block);
                map.env_start = block.as_ptr() as u64;
                map.env_end = map.env_start + block.len() as u64;
            }
        }
        // SAFETY: brk(0) only reads the current break; prctl reads `map`, a valid struct of
        // the size given, and changes only what /proc reports of this process.
        unsafe {
            map.brk = libc::syscall(libc::SYS_brk, 0usize) as u64;
            libc::prctl(
                libc::PR_SET_MM,
                libc::PR_SET_MM_MAP as libc::c_ulong,
                &map as *const MmMap as libc::c_ulong,
                std::mem::size_of::<MmMap>() as libc::c_ulong,
                0 as libc::c_ulong,
            );
        }
    }
}

/// Gives the kernel back the free pages of the interpreter's `malloc` heap, once started and
/// before it says so: compiling preloaded sources leaves freed but resident heap behind (1.9
/// of 11.5 MB for the Evaluator's harness), which every fork would copy the page table entries
/// of and every exit tear down. It must come before the interpreter reports ready: the
/// supervisor then samples the slot's memory as the interpreter's baseline, which each run's
/// memory limit is counted above.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of glibc's own arenas to the kernel; the
    // interpreter is single-threaded here.
    unsafe {
        libc::malloc_trim(0);
    }
}

static FILTERS: OnceLock<(Filter, Filter)> = OnceLock::new();

/// The highest capability number, read once (a run would otherwise read `/proc` for it).
static CAP_LAST: OnceLock<u32> = OnceLock::new();

/// Compiles both seccomp policies once, before any fork (so children only install them).
pub fn interpreter_init() {
    CAP_LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40)
    });
    FILTERS.get_or_init(|| {
        (
            Filter::compile(&Policy {
                allow_network: false,
            }),
            Filter::compile(&Policy {
                allow_network: true,
            }),
        )
    });
}

/// Clears every capability set of the calling thread.
fn clear_capabilities() -> Result<(), i32> {
    let header = [0x2008_0522u32, 0];
    let data = [0u32; 6];
    // SAFETY: capset with a version-3 header and two data entries; prctl with flags only.
    unsafe {
        if libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) < 0
            || libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            ) < 0
        {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EPERM));
        }
    }
    Ok(())
}

/// What the idle init's clone child needs, built before the clone.
struct InitPlan {
    path: CString,
    argv: [*const libc::c_char; 2],
    envp: [*const libc::c_char; 1],
    /// The errno of a failed step: the child shares our memory until `execve`.
    failed: AtomicI32,
}

/// The idle init's stack (one warm run at a time per interpreter).
static INIT_STACK: std::sync::Mutex<Option<ChildStack>> = std::sync::Mutex::new(None);

/// In the interpreter, after [`unshare_pid`]: starts the run's init, pid 1 of the new pid
/// namespace (the idle init of [`crate::init`]), and returns its pid and pidfd.
///
/// The init is a `clone(CLONE_VM | CLONE_VFORK)` child, as `posix_spawn` makes them: it
/// copies none of the interpreter's memory and runs only raw system calls until `execve`:
/// `SIGCHLD` ignored (the kernel then reaps the orphans it inherits), killed if the
/// interpreter dies, no fds, no capabilities, `no_new_privs`. It stays root of the
/// interpreter's user namespace, so the run (the box user) can neither signal nor trace it.
fn spawn_init() -> std::io::Result<(libc::pid_t, OwnedFd)> {
    let mut guard = INIT_STACK.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(ChildStack::new(64 << 10)?);
    }
    let stack = guard.as_ref().expect("just set");
    let path = CString::new(crate::init::IDLE_PATH).expect("no NUL");
    let mut plan = InitPlan {
        argv: [path.as_ptr(), std::ptr::null()],
        envp: [std::ptr::null()],
        path,
        failed: AtomicI32::new(0),
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: init_entry matches the callback type and only reads the plan, which lives until
    // the child has exec'd or exited (CLONE_VFORK suspends us until then); the stack is ours
    // and used by one child at a time (the interpreter is single-threaded); &mut pidfd
    // receives the pidfd (CLONE_PIDFD).
    let pid = unsafe {
        libc::clone(
            init_entry,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            &mut plan as *mut InitPlan as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh pidfd from clone, owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let failed = plan.failed.load(Ordering::SeqCst);
    if failed != 0 {
        supervise::reap(pid);
        return Err(std::io::Error::from_raw_os_error(failed));
    }
    Ok((pid, pidfd))
}

extern "C" fn init_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: spawn_init passes a pointer to an InitPlan that outlives the child's use.
    let p = unsafe { &*(arg as *const InitPlan) };
    let fail = |r: isize| {
        if r < 0 {
            p.failed.store((-r) as i32, Ordering::SeqCst);
            // SAFETY: exit_group ends this process only (no CLONE_THREAD).
            unsafe { syscall3(libc::SYS_exit_group, 126, 0, 0) };
        }
    };
    let ignore = KernelSigaction {
        handler: libc::SIG_IGN,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    let header = [0x2008_0522u32, 0];
    let data = [0u32; 6];
    // SAFETY: raw system calls (no errno, no allocation, no lock) on buffers of this frame
    // and of the plan; our signal handlers and fd table are our own copies (no CLONE_SIGHAND,
    // no CLONE_FILES), so none of this touches the interpreter.
    unsafe {
        fail(syscall6(
            libc::SYS_rt_sigaction,
            libc::SIGCHLD as usize,
            &ignore as *const KernelSigaction as usize,
            0,
            8,
            0,
            0,
        ));
        fail(syscall3(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG as usize,
            libc::SIGKILL as usize,
            0,
        ));
        fail(syscall3(
            libc::SYS_capset,
            header.as_ptr() as usize,
            data.as_ptr() as usize,
            0,
        ));
        fail(syscall6(
            libc::SYS_prctl,
            libc::PR_SET_NO_NEW_PRIVS as usize,
            1,
            0,
            0,
            0,
            0,
        ));
        syscall3(libc::SYS_close_range, 0, u32::MAX as usize, 0);
        let r = syscall3(
            libc::SYS_execve,
            p.path.as_ptr() as usize,
            p.argv.as_ptr() as usize,
            p.envp.as_ptr() as usize,
        );
        fail(r.min(-1));
    }
    126
}

/// The interpreter's own pid namespace (opened once).
static OWN_PID_NS: OnceLock<std::io::Result<OwnedFd>> = OnceLock::new();

/// Receives the next request on the control socket: its payload and fds, or `None` at end of
/// file. The caller wipes the payload once the run is forked (see `wipe`).
fn receive_request(
    ctl: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<Option<(Vec<u8>, Vec<RawFd>)>> {
    use std::os::fd::IntoRawFd;
    Ok(fdpass::recv(ctl, None)?
        .map(|(data, fds)| (data, fds.into_iter().map(|f| f.into_raw_fd()).collect())))
}

/// SIGKILLs the interpreter's own child `pid` and reaps it (for the run's init: once its pid
/// namespace is empty).
fn kill_and_reap(pid: libc::pid_t) {
    // SAFETY: SIGKILL to our own child, not yet reaped (so its pid is still its own).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    supervise::reap(pid);
}

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
fn report_exit(
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

/// Wipes a request (in the interpreter, once the run is forked): nothing of one run's request
/// stays in the memory the next fork copies into another run.
fn wipe(v: &mut Vec<u8>) {
    for b in v.iter_mut() {
        // SAFETY: writing a zero to a valid &mut u8; volatile so the wipe is not elided.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    v.clear();
}

/// Moves the interpreter into a new IPC namespace, for its next run to inherit at the fork.
///
/// A warm run must have an IPC namespace of its own, as a cold run does: in a shared one, the
/// SysV shared memory, semaphores and message queues and the POSIX message queues one run
/// creates would be there for the next (one episode could hand answers to later ones). The
/// interpreter uses no IPC itself, so instead of the run unsharing on its own path (about
/// 30 µs, most of it mounting the namespace's internal mqueue file system), the interpreter
/// moves into a fresh namespace between runs, and each is inherited by exactly one run (and
/// that run's init). The old one is freed by the kernel once its run is gone.
fn unshare_ipc() -> std::io::Result<()> {
    // SAFETY: unshare with a flag only; the interpreter is root of its user namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWIPC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the interpreter's next child the init of a new pid namespace. A process may unshare
/// its children's pid namespace only while that is still its own, so it first goes back to
/// its own (`setns`), then unshares afresh.
fn unshare_pid() -> std::io::Result<()> {
    let own =
        OWN_PID_NS.get_or_init(|| std::fs::File::open("/proc/self/ns/pid").map(OwnedFd::from));
    let own = own
        .as_ref()
        .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?;
    // SAFETY: setns/unshare with a valid namespace fd and flags only; the interpreter is
    // single-threaded.
    unsafe {
        if libc::setns(own.as_raw_fd(), libc::CLONE_NEWPID) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::unshare(libc::CLONE_NEWPID) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the forked child: builds the run's view and drops every privilege, exactly as a cold
/// run does, then closes every fd but 0/1/2 and the fds passed to the run. `fds` are, in
/// order: run tmpfs, stdin, stdout, stderr, status pipe, listener socket, the "go" pipe, then
/// the fds passed to the run ([`crate::RunRequest::pass_fds`]), which become its fds 3, 4, ...
/// Returns the environment to install (`None`: the interpreter's own, `own_env` as
/// [`encode_env`] writes it); on failure it reports the step on the status pipe and exits
/// with status 126. The "go" pipe is read once everything else is done: the supervisor writes
/// to it after moving this process into the slot's cgroup.
fn child_setup(payload: &[u8], fds: &[RawFd], own_env: &[u8]) -> Option<Env> {
    let status = fds.get(4).copied().unwrap_or(-1);
    let fail = |step: Step, errno: i32| -> ! {
        let mut rec = [0u8; 8];
        rec[..4].copy_from_slice(&(step as u32).to_ne_bytes());
        rec[4..].copy_from_slice(&errno.to_ne_bytes());
        // SAFETY: writing a valid buffer, then leaving the process without unwinding.
        unsafe {
            libc::write(status, rec.as_ptr().cast(), 8);
            libc::_exit(126)
        }
    };
    let last = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    let Some(req) = decode(payload, own_env) else {
        fail(Step::Sync, libc::EINVAL)
    };
    if fds.len() < 7 || fds.len() > 7 + crate::config::MAX_PASS_FDS {
        fail(Step::Sync, libc::EBADF);
    }
    let passed = &fds[7..];
    let ok = |r: libc::c_int, step: Step| {
        if r < 0 {
            fail(step, last());
        }
    };
    // SAFETY (whole block): plain system calls on valid paths and fds in a single-threaded
    // forked child; every failure ends the process.
    unsafe {
        ok(libc::unshare(libc::CLONE_NEWNS), Step::MountRun);
        let (empty, run) = (c"", c"/.run");
        let r = libc::syscall(
            libc::SYS_move_mount,
            fds[0],
            empty.as_ptr(),
            libc::AT_FDCWD,
            run.as_ptr(),
            0x4u32,
        );
        ok(r as libc::c_int, Step::MountRun);
        for (src, dst, step) in [
            (c"/.run/work", c"/work", Step::BindWork),
            (c"/.run/tmp", c"/tmp", Step::BindTmp),
            (c"/.run/shm", c"/dev/shm", Step::BindShm),
        ] {
            let (s, d) = (src, dst);
            ok(
                libc::mount(
                    s.as_ptr(),
                    d.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ),
                step,
            );
        }
        let (proc_, sys) = (c"/proc", c"/proc/sys");
        let fstype = c"proc";
        ok(
            libc::mount(
                fstype.as_ptr(),
                proc_.as_ptr(),
                fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ),
            Step::MountProc,
        );
        ok(
            libc::mount(
                sys.as_ptr(),
                sys.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ),
            Step::BindProcSys,
        );
        ok(
            libc::mount(
                std::ptr::null(),
                sys.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND
                    | libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | libc::MS_NOEXEC,
                std::ptr::null(),
            ),
            Step::RemountProcSys,
        );
        // A devpts instance of the run's own: no run sees another's terminals.
        let (devpts, pts) = (c"devpts", c"/dev/pts");
        ok(
            libc::mount(
                devpts.as_ptr(),
                pts.as_ptr(),
                devpts.as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                crate::spawn::DEVPTS_OPTIONS.as_ptr().cast(),
            ),
            Step::MountPts,
        );
        ok(libc::setsid(), Step::Setsid);
        for (fd, target) in [(fds[1], 0), (fds[2], 1), (fds[3], 2)] {
            ok(libc::dup2(fd, target), Step::Stdio);
        }
        // The passed fds become 3, 4, ... at the end; first each is copied above that range,
        // where no later step can take its number.
        let first = 3 + passed.len() as libc::c_int;
        let mut high = [-1; crate::config::MAX_PASS_FDS];
        for (h, &fd) in high.iter_mut().zip(passed) {
            *h = libc::fcntl(fd, libc::F_DUPFD, first);
            ok(*h, Step::Stdio);
        }
        for (res, lim) in &req.rlimits {
            ok(
                libc::prlimit64(0, *res, lim, std::ptr::null_mut()),
                Step::Rlimit,
            );
        }
        // Wait until the supervisor releases the run.
        let mut b = [0u8; 1];
        if libc::read(fds[6], b.as_mut_ptr().cast(), 1) != 1 {
            fail(Step::Sync, libc::EPIPE);
        }
        // The OOM killer must pick the run, never its interpreter: a run that fills its
        // cgroup with tmpfs pages (which count to no process) would otherwise leave the
        // interpreter as the largest process. Raising one's own score needs no privilege; the
        // run's init and program inherit it.
        let adj = c"/proc/self/oom_score_adj";
        let fd = libc::open(adj.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 || libc::write(fd, b"1000".as_ptr().cast(), 4) != 4 {
            fail(Step::Setsid, last());
        }
        libc::close(fd);
        interpreter_init();
        let cap_last = *CAP_LAST.get().expect("initialised above");
        for cap in 0..=cap_last {
            ok(
                libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0),
                Step::CapBound,
            );
        }
        ok(libc::setgroups(0, std::ptr::null()), Step::Setgroups);
        ok(libc::setresgid(BOX_ID, BOX_ID, BOX_ID), Step::Setgid);
        ok(libc::setresuid(BOX_ID, BOX_ID, BOX_ID), Step::Setuid);
        // Changing uid made the process non-dumpable (root-owned /proc/self files); an
        // execve would have made it dumpable again, as a cold run is.
        ok(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0), Step::Setuid);
        clear_capabilities().unwrap_or_else(|e| fail(Step::Capset, e));
        ok(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            Step::NoNewPrivs,
        );
        ok(
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ),
            Step::DeathSig,
        );
        ok(libc::chdir(req.cwd.as_ptr()), Step::Chdir);
        interpreter_init();
        let (plain, net) = FILTERS.get().expect("initialised above");
        let filter = if req.network { net } else { plain };
        let listener = match filter.install() {
            Ok(fd) => fd,
            Err(e) => fail(Step::Seccomp, e),
        };
        if seccomp::send_fd(fds[5], listener) < 0 {
            fail(Step::SendListener, last());
        }
        libc::close(listener);
        let mut rec = [0u8; 8];
        rec[..4].copy_from_slice(&(Step::Started as u32).to_ne_bytes());
        libc::write(status, rec.as_ptr().cast(), 8);
        // The passed fds into place as 3, 4, ... (dup2 clears close-on-exec); what those
        // numbers held is no longer needed. dup2 of an open fd below the fd limit only fails
        // on a kernel race (EBUSY), after the supervisor was told the run started: the run
        // then ends with status 126.
        for (i, &h) in high[..passed.len()].iter().enumerate() {
            if libc::dup2(h, 3 + i as libc::c_int) < 0 {
                libc::_exit(126);
            }
        }
        // Nothing of the interpreter's stays open: not its control socket, not the request.
        libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32);
    }
    req.env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(env: &[&str]) -> Vec<u8> {
        let env: Vec<CString> = env.iter().map(|e| CString::new(*e).unwrap()).collect();
        let rlimits = [(
            3u32,
            libc::rlimit64 {
                rlim_cur: 5,
                rlim_max: 6,
            },
        )];
        encode(true, &rlimits, b"/work", &env)
    }

    #[test]
    fn requests_round_trip() {
        let own = encode_env([b"A=1".as_slice()].into_iter());
        let req = decode(&request(&["PATH=/bin", "X=a=b"]), &own).unwrap();
        assert!(req.network);
        assert_eq!(req.rlimits.len(), 1);
        assert_eq!(
            (req.rlimits[0].1.rlim_cur, req.rlimits[0].1.rlim_max),
            (5, 6)
        );
        assert_eq!(req.cwd.as_bytes(), b"/work");
        let env = req.env.unwrap();
        assert_eq!(
            env,
            [("PATH".into(), "/bin".into()), ("X".into(), "a=b".into())]
        );
    }

    #[test]
    fn the_interpreters_own_environment_is_not_rebuilt() {
        let own = encode_env([b"A=1".as_slice(), b"B=2"].into_iter());
        assert!(decode(&request(&["A=1", "B=2"]), &own)
            .unwrap()
            .env
            .is_none());
        // Order counts (the run's environment keeps the request's order).
        let other = decode(&request(&["B=2", "A=1"]), &own).unwrap();
        assert_eq!(other.env.unwrap().len(), 2);
        assert_eq!(decode(&request(&[]), &own).unwrap().env.unwrap(), []);
    }

    #[test]
    fn the_shown_arguments_are_the_interpreters_first_and_main() {
        let shown = ShownArgs::new();
        let map = shown
            .map
            .expect("this process's /proc/self/stat is readable");
        assert!(map.start_code < map.end_code && map.arg_start < map.arg_end);
        assert!(map.env_start <= map.env_end && map.exe_fd == u32::MAX);
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap();
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap();
        assert_eq!(shown.args, [argv0, b"\0__main__.py\0"].concat());
        assert!(ShownArgs::parse_stat("1 (a) S").is_none());
    }

    #[test]
    fn malformed_requests_are_refused() {
        let own = encode_env(std::iter::empty());
        let full = request(&["A=1"]);
        for cut in 0..full.len() {
            assert!(decode(&full[..cut], &own).is_none(), "cut at {cut}");
        }
        let mut long = full.clone();
        long.push(0);
        assert!(decode(&long, &own).is_none(), "trailing bytes");
        assert!(decode(&request(&["NOEQUALS"]), &own).is_none());
    }
}
