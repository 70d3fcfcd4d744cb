//! One run in a slot: per-run I/O, launching the box (cold: a new clone; warm: a fork of the
//! slot's warm interpreter), watching it, and the verdict.
//!
//! # Off the critical path
//! A caller waits from submission to verdict; whatever the slot can do before or after that
//! window it does there ([`Between`], [`between_runs`]):
//! - The channels of a run (its tmpfs with `work/`, `tmp/` and `shm/`, the output and status
//!   pipes, the listener socket) are made after the previous verdict, for the same tmpfs size.
//!   Only the input files and stdin are written once the run is asked for.
//! - A cold box's mount namespace is held through its pidfd until the verdict is delivered.
//!   Otherwise the box's init tears it down as it exits, before its pidfd reports the exit:
//!   unmounting waits for an RCU grace period, and the run's tmpfs and `/proc` are freed
//!   there. Every process of the box is gone by then (the pid namespace dies with its
//!   init); only its file systems wait, and the slot frees them before it takes another run,
//!   so they never count against the next run's memory.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::cgroup;
use crate::fdpass;
use crate::mounts::{RunFs, BOX_ID};
use crate::sandbox::{Prepared, Shared, Slot};
use crate::seccomp;
use crate::spawn::{self, ChildPlan, Step};
use crate::supervise::{self, Capture, Kill};
use crate::verdict::{ExecResult, LimitKind, Status};
use crate::zygote;

pub(crate) type RunResult<T> = std::result::Result<T, String>;

/// Runs one prepared request in `slot`; infrastructure failures become `sandbox_error`.
pub(crate) fn run_in_slot(shared: &Shared, slot: &mut Slot, run: &Prepared) -> ExecResult {
    match run_inner(shared, slot, run) {
        Ok(r) => r,
        Err(e) => ExecResult::sandbox_error(crate::rlimit::explain_fd_exhaustion(e)),
    }
}

/// The per-run channels: the tmpfs, stdin, output pipes, the set-up status pipe and the
/// socket the child hands its seccomp listener through.
pub(crate) struct RunIo {
    pub channels: Channels,
    pub stdin: OwnedFd,
}

/// The channels of a run that do not depend on its input, so that a slot can make them
/// before the run is asked for.
pub(crate) struct Channels {
    pub runfs: RunFs,
    pub out_r: OwnedFd,
    pub out_w: OwnedFd,
    pub err_r: OwnedFd,
    pub err_w: OwnedFd,
    pub status_r: OwnedFd,
    pub status_w: OwnedFd,
    pub sock_parent: OwnedFd,
    pub sock_child: OwnedFd,
    /// What the tmpfs was made for: its size and the host id owning its directories.
    made_for: (u64, u32),
}

fn io_error(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |e| format!("{what}: {e}")
}

impl Channels {
    fn new(tmpfs_bytes: u64, host_id: u32) -> RunResult<Channels> {
        let runfs = RunFs::empty(tmpfs_bytes, host_id, host_id)
            .map_err(io_error("creating the run tmpfs"))?;
        let (out_r, out_w) = pipe().map_err(io_error("pipe"))?;
        let (err_r, err_w) = pipe().map_err(io_error("pipe"))?;
        let (status_r, status_w) = pipe().map_err(io_error("pipe"))?;
        let (sock_parent, sock_child) = fdpass::seqpacket_pair().map_err(io_error("socketpair"))?;
        set_nonblocking(out_r.as_raw_fd());
        set_nonblocking(err_r.as_raw_fd());
        // The box may reopen its own output through `/dev/stdout`, `/dev/stderr` or
        // `/proc/self/fd/N` (a pipe's inode is mode 0600), as any process may its own pipes.
        for fd in [&out_w, &err_w] {
            give_to(fd.as_fd(), host_id).map_err(io_error("handing the output pipes over"))?;
        }
        Ok(Channels {
            runfs,
            out_r,
            out_w,
            err_r,
            err_w,
            status_r,
            status_w,
            sock_parent,
            sock_child,
            made_for: (tmpfs_bytes, host_id),
        })
    }
}

impl RunIo {
    /// The run's channels: the slot's spare ones when they fit, else new ones (a spare that
    /// does not fit, say for a session step, stays for the slot's next ordinary run).
    fn new(between: &mut Between, run: &Prepared, host_id: u32) -> RunResult<RunIo> {
        let want = (run.limits.tmpfs_bytes, host_id);
        let channels = match between.spare.take_if(|c| c.made_for == want) {
            Some(c) => c,
            None => Channels::new(want.0, want.1)?,
        };
        channels
            .runfs
            .write_inputs(&run.files, host_id, host_id)
            .map_err(io_error("creating the run tmpfs"))?;
        let stdin = memfd_with(&run.stdin).map_err(io_error("preparing stdin"))?;
        give_to(stdin.as_fd(), host_id).map_err(io_error("preparing stdin"))?;
        Ok(RunIo { channels, stdin })
    }
}

/// What a slot does between two runs, off its caller's critical path: once the caller has
/// the verdict, it frees what the run left (above all the box's mount namespace, whose
/// teardown waits for an RCU grace period) and makes the channels of the next run.
#[derive(Default)]
pub(crate) struct Between {
    /// Dropped after the verdict is delivered.
    garbage: Vec<Box<dyn std::any::Any>>,
    /// Channels made for the next run, for the tmpfs size and host id of the last one.
    spare: Option<Channels>,
    /// The tmpfs size of the last run that used the slot's own host id.
    last_tmpfs_bytes: Option<u64>,
}

impl Between {
    fn defer(&mut self, what: impl std::any::Any) {
        self.garbage.push(Box::new(what));
    }
}

/// Runs between two runs of a slot, after the caller has the verdict of the first: frees what
/// it left, then makes spare channels like those of the last ordinary run, unless it has them
/// already. A failure only means no spare (the next run makes its own channels and reports
/// the error).
pub(crate) fn between_runs(slot: &mut Slot) {
    let b = &mut slot.between;
    b.garbage.clear();
    let Some(size) = b.last_tmpfs_bytes else {
        return;
    };
    let want = (size, slot.host_id);
    if b.spare.as_ref().map(|c| c.made_for) != Some(want) {
        // The stale spare's fds go first: a slot never holds two sets.
        b.spare = None;
        b.spare = Channels::new(want.0, want.1).ok();
    }
}

/// How the box is reaped once its pidfd says it exited.
pub(crate) enum Reaper {
    /// Our own clone child.
    Wait4(libc::pid_t),
    /// A child of the slot's warm interpreter, which reports the status.
    Zygote,
}

/// A box that has reached `execve` (or the start of the user's code, on the warm path).
pub(crate) struct Live {
    /// The process whose exit ends the run (the box's init, or a warm run's program).
    pub pidfd: OwnedFd,
    /// The box's pid 1 when that is another process (a warm run's idle init).
    pub kill: Option<OwnedFd>,
    pub reaper: Reaper,
    pub listener: OwnedFd,
    /// The box's mount namespace (cold runs, where the kernel can tell it): held until the
    /// verdict is delivered, so that its teardown is not on the caller's critical path.
    pub mnt_ns: Option<OwnedFd>,
}

pub(crate) enum Launch {
    Live(Live),
    /// The program could not be executed (no such file, not executable...).
    ExecFailed(Step, i32),
}

fn run_inner(shared: &Shared, slot: &mut Slot, run: &Prepared) -> RunResult<ExecResult> {
    let l = &run.limits;
    if run.warm && shared.config.warm.is_none() {
        return Err("the warm interpreter is not configured for this sandbox".into());
    }
    if cancelled(run) {
        return Err("the run was cancelled before it started".into());
    }
    if run.warm {
        zygote::ensure(shared, slot)?;
    }
    let host_id = run
        .session
        .as_ref()
        .map(|(_, id)| *id)
        .unwrap_or(slot.host_id);
    if run.session.is_none() {
        slot.between.last_tmpfs_bytes = Some(l.tmpfs_bytes);
    }
    let io = RunIo::new(&mut slot.between, run, host_id)?;
    if !run.warm && slot.zygote.as_ref().is_some_and(|z| !zygote::is_alive(z)) {
        zygote::discard(slot);
    }
    // A live warm interpreter holds memory and a pid in the slot's cgroup whichever kind of
    // run comes next: that is the slot's baseline, added to the run's limits and taken off
    // its peak, so that a cold run after a warm one gets the same limits as in a fresh slot.
    let baseline = slot.zygote.as_ref().map(|z| z.baseline_memory).unwrap_or(0);
    let mut own_cg = run_cgroup(shared, slot, run)?;
    if let Some(cg) = &mut own_cg {
        cg.set_limits(Some(l.memory_bytes), Some(l.max_pids))
            .map_err(|e| format!("run cgroup limits: {e}"))?;
        cg.prepare_run()
            .map_err(|e| format!("run cgroup reset: {e}"))?;
    }

    // Otherwise the run is in the slot's cgroup, which gets the run's limits.
    if let Some(cg) = slot.cgroup.as_mut().filter(|_| own_cg.is_none()) {
        // Extra pids: on cgroup v1 the slot thread is a member; the warm interpreter is one.
        let extra = u64::from(shared.cgroup_version == Some(cgroup::Version::V1))
            + u64::from(slot.zygote.is_some());
        cg.set_limits(Some(l.memory_bytes + baseline), Some(l.max_pids + extra))
            .map_err(|e| format!("cgroup limits: {e}"))?;
        cg.prepare_run().map_err(|e| format!("cgroup reset: {e}"))?;
    }
    let thread_cpu0 = thread_cpu_ns();
    let RunIo {
        channels:
            Channels {
                runfs,
                out_r,
                out_w,
                err_r,
                err_w,
                status_r,
                status_w,
                sock_parent,
                sock_child,
                made_for: _,
            },
        stdin,
    } = io;
    let child_fds = ChildFds {
        run_mount: runfs.mount.as_fd(),
        stdin: stdin.as_fd(),
        stdout: out_w.as_fd(),
        stderr: err_w.as_fd(),
        listener_sock: sock_child.as_fd(),
    };
    // The status pipe's write end is handed over: the launch closes our copy, so that end of
    // file on it means "exec happened".
    let launched = if run.warm {
        zygote::launch(
            shared,
            slot,
            run,
            &child_fds,
            (status_r.as_fd(), status_w),
            sock_parent.as_fd(),
        )
    } else {
        launch_cold(
            shared,
            slot,
            own_cg.as_ref(),
            run,
            &child_fds,
            (status_r.as_fd(), status_w),
            sock_parent.as_fd(),
        )
    };
    drop((out_w, err_w, sock_child, stdin));
    let live = match launched {
        Err(e) => {
            if run.warm {
                zygote::discard(slot);
            }
            return Err(e);
        }
        Ok(Launch::ExecFailed(step, errno)) => {
            // The caller's mistake (no such program or directory), not the sandbox's.
            let err = std::io::Error::from_raw_os_error(errno);
            let mut r = ExecResult::sandbox_error("");
            r.status = Status::RuntimeError;
            r.error = None;
            r.exit_code = Some(if step == Step::Exec { 127 } else { 126 });
            r.stderr = if step == Step::Exec {
                format!(
                    "agentrl: cannot execute {}: {err}\n",
                    run.argv[0].to_string_lossy()
                )
            } else {
                format!(
                    "agentrl: cannot enter the working directory {}: {err}\n",
                    run.cwd.to_string_lossy()
                )
            }
            .into_bytes();
            // Live output shows it too: it stands for what the program would have said.
            if let Some((tee, out, err)) = run.tee.lock().unwrap_or_else(|e| e.into_inner()).take()
            {
                err.send(&r.stderr);
                drop((out, err));
                tee.finish(crate::tee::FINISH_WAIT);
            }
            return Ok(r);
        }
        Ok(Launch::Live(live)) => live,
    };
    let started = Instant::now();
    let mut out = Capture::new(out_r, l.max_output_bytes);
    let mut err = Capture::new(err_r, l.max_output_bytes);
    let tee = match run.tee.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some((tee, o, e)) => {
            (out.tee, err.tee) = (Some(o), Some(e));
            Some(tee)
        }
        None => None,
    };
    let cg = own_cg.as_ref().or(slot.cgroup.as_ref());
    // Where the kernel cannot give an exact per-run peak (cgroup v2 before Linux 6.12, in the
    // slot's own cgroup), the memory is sampled at every CPU-time poll (about every 10 ms) as a
    // lower bound.
    let sample = cg.is_some_and(|c| c.peak_memory_mode() != cgroup::PeakMemory::PerRun);
    let cpu_time = || -> Option<u64> {
        let c = cg?;
        if sample {
            let _ = c.sample_memory();
        }
        let ns = c.cpu_time_ns().ok()?;
        Some(ns.saturating_sub(thread_cpu_ns().saturating_sub(thread_cpu0)))
    };
    let w = supervise::watch(
        supervise::Params {
            pidfd: live.pidfd.as_fd(),
            kill: live.kill.as_ref().unwrap_or(&live.pidfd).as_fd(),
            listener: Some(live.listener.as_fd()),
            deadline: started + Duration::from_secs_f64(l.wall_time_s),
            cpu_limit_ns: (l.cpu_time_s * 1e9) as u64,
            cpu_time: &cpu_time,
            cancel: run.cancel.as_deref(),
        },
        &mut out,
        &mut err,
    );
    let wall = started.elapsed().as_secs_f64();
    // A warm run's interpreter reaps the program and then its init: once it has reported,
    // nothing of the run is left to touch its files. It waits (allocating nothing) until
    // the files are freed below.
    let was_warm = matches!(live.reaper, Reaper::Zygote);
    let warm_exit = match live.reaper {
        Reaper::Zygote => Some(zygote::wait_exit(slot)),
        Reaper::Wait4(_) => None,
    };
    // Collect the files and free the run's file system before anything else: its pages stay
    // charged to the slot's memory until then.
    let mut files = Vec::new();
    let mut truncated_files = Vec::new();
    for (name, parts) in &run.collect {
        let got = match &run.session {
            Some((work, _)) => {
                crate::mounts::collect_at(work.as_fd(), b"", parts, l.max_file_bytes)
            }
            None => runfs.collect(parts, l.max_file_bytes),
        };
        if let Some((data, cut)) = got {
            if cut {
                truncated_files.push(name.clone());
            }
            files.push((name.clone(), data));
        }
    }
    let exit_record = read_exit_record(status_r.as_fd());
    if run.warm {
        // The warm interpreter allocates nothing until it is released below, and a run that
        // filled the slot's memory with tmpfs pages would leave it no room until they go.
        drop(runfs);
    } else {
        // Nothing runs in the slot until the next run, and the slot frees this before it.
        slot.between.defer(runfs);
    }
    let exit = match (live.reaper, warm_exit) {
        (Reaper::Wait4(pid), _) => {
            let mut exit = supervise::reap(pid);
            // The box's init reports how the program (pid 2) ended; without that report (the
            // init was killed with the whole box) only what the supervisor itself did can
            // explain it.
            match exit_record {
                Some(st) => exit.wait_status = st,
                None if w.killed.is_none() && !oom_in(own_cg.as_ref().or(slot.cgroup.as_ref())) => {
                    return Err(format!(
                        "the box ended without its init's report (init wait status {:#x})",
                        exit.wait_status
                    ));
                }
                None => {}
            }
            exit
        }
        (Reaper::Zygote, Some(Ok(exit))) => {
            if zygote::release(slot).is_err() {
                zygote::discard(slot);
            }
            exit
        }
        (Reaper::Zygote, other) => {
            // The interpreter died (a run that filled the slot's memory can take it down
            // with it), killing the run with it. It is replaced for the next run; this run's
            // verdict stands only if the supervisor or the memory limit ended it.
            zygote::discard(slot);
            if w.killed.is_none() && !oom_in(own_cg.as_ref().or(slot.cgroup.as_ref())) {
                return Err(match other {
                    Some(Err(e)) => e,
                    _ => "the warm interpreter did not report the run's exit".into(),
                });
            }
            supervise::Exit {
                wait_status: libc::SIGKILL,
                rusage: zeroed_rusage(),
            }
        }
    };
    let fds = (sock_parent, status_r, live.pidfd, live.kill, live.listener);
    slot.between.defer((fds, live.mnt_ns));
    if w.killed == Some(Kill::Cancelled) {
        return Err("the run was cancelled".into());
    }

    // Live output: everything read is queued; wait until it is written.
    (out.tee, err.tee) = (None, None);
    if let Some(t) = tee {
        t.finish(crate::tee::FINISH_WAIT);
    }
    let usage = match own_cg.as_ref().or(slot.cgroup.as_ref()) {
        Some(cg) => Some(
            cg.usage()
                .map_err(|e| format!("reading the run's cgroup: {e}"))?,
        ),
        None => None,
    };
    // Not charged the warm interpreter: nothing to take off its peak.
    let baseline = if own_cg.is_some() { 0 } else { baseline };
    // The box is reaped: its cgroup goes now (its leftover tmpfs pages go with the run's file
    // system, freed before the slot's next run).
    drop(own_cg);
    let rusage_cpu = tv(&exit.rusage.ru_utime) + tv(&exit.rusage.ru_stime);
    let cpu_time_s = match &usage {
        Some(u) => {
            let own = thread_cpu_ns().saturating_sub(thread_cpu0);
            (u.cpu_time_ns.saturating_sub(own) as f64 / 1e9).max(rusage_cpu)
        }
        None => rusage_cpu,
    };
    // The slot cgroup's figure (exact, or a lower bound where the kernel cannot reset the
    // peak). Without a cgroup (degraded), the rusage of a warm run's fork (the interpreter's
    // pages it shares count); a cold box's pid 1 starts as a CLONE_VM child of this process,
    // so its rusage would be this process's size, and none is given.
    let (peak, peak_exact) = match &usage {
        Some(u) => (
            u.peak_memory_bytes.map(|p| p.saturating_sub(baseline)),
            u.peak_memory_exact,
        ),
        None if was_warm => (Some(exit.rusage.ru_maxrss as u64 * 1024), false),
        None => (None, false),
    };
    let st = exit.wait_status;
    let (exit_code, signal) = if libc::WIFEXITED(st) {
        (Some(libc::WEXITSTATUS(st)), None)
    } else {
        (None, Some(libc::WTERMSIG(st)))
    };
    let oom = usage.as_ref().map(|u| u.oom_killed).unwrap_or(false);
    let pids_hit = usage.as_ref().map(|u| u.pids_limit_hit).unwrap_or(false);
    let (status, limit) = classify(
        oom,
        w.killed,
        signal,
        exit_code,
        cpu_time_s >= l.cpu_time_s,
        out.truncated() || err.truncated(),
        pids_hit,
    );
    Ok(ExecResult {
        status,
        exit_code,
        signal,
        stdout_truncated: out.truncated(),
        stderr_truncated: err.truncated(),
        stdout: std::mem::take(&mut out.data),
        stderr: std::mem::take(&mut err.data),
        wall_time_s: wall,
        cpu_time_s,
        peak_memory_bytes: peak,
        peak_memory_exact: peak.is_some() && peak_exact,
        limit,
        denied_syscalls: w.denied,
        files,
        truncated_files,
        error: None,
    })
}

fn cancelled(run: &Prepared) -> bool {
    run.cancel
        .as_ref()
        .is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst))
}

/// The status and the limit that decided it, in order of precedence.
fn classify(
    oom: bool,
    killed: Option<Kill>,
    signal: Option<i32>,
    exit_code: Option<i32>,
    cpu_exhausted: bool,
    truncated: bool,
    pids_hit: bool,
) -> (Status, Option<LimitKind>) {
    crate::verdict::classify(
        oom,
        killed,
        signal,
        exit_code,
        cpu_exhausted,
        truncated,
        pids_hit,
    )
}

/// The fds a child needs (it duplicates them; the parent closes its copies after launch).
pub(crate) struct ChildFds<'a> {
    pub run_mount: BorrowedFd<'a>,
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    pub listener_sock: BorrowedFd<'a>,
}

/// What `clone_box` should make.
pub(crate) struct BoxSpec<'a> {
    pub argv: &'a [std::ffi::CString],
    pub exec_paths: &'a [std::ffi::CString],
    pub env: &'a [std::ffi::CString],
    pub cwd: &'a std::ffi::CString,
    pub rlimits: &'a [(u32, libc::rlimit64)],
    /// `uid_map`/`gid_map` contents.
    pub id_map: String,
    /// For the warm interpreter: its control socket (becomes fd 3); it keeps root in the box.
    pub zygote_control: Option<BorrowedFd<'a>>,
    /// For a session step: the overlay to attach at `/work`.
    pub work_mount: Option<BorrowedFd<'a>>,
    /// Host uid that owns the box's user namespace: the kernel charges the box's per-user
    /// counts (inotify instances, user namespaces, ...) to it, so it must be the box's own
    /// unprivileged uid, never root (whose limits the host itself lives on).
    pub owner: u32,
    /// The cgroup the box joins: the slot's, or a cold run's own (see [`run_cgroup`]). On v2
    /// the box shows it at `/sys/fs/cgroup` (a cgroup2 mount of its own).
    pub cgroup: Option<&'a cgroup::Slot>,
}

/// Clones a new box in the slot and waits until it has exec'd. Returns `(pid, pidfd)` or
/// the step (`Exec` or `Chdir`) and errno of a failure that is the caller's; `Err` for
/// set-up failures (the child is killed and reaped).
pub(crate) fn clone_box(
    shared: &Shared,
    slot: &Slot,
    spec: &BoxSpec<'_>,
    fds: &ChildFds<'_>,
    (status_r, status_w): (BorrowedFd<'_>, OwnedFd),
) -> RunResult<std::result::Result<(libc::pid_t, OwnedFd), (Step, i32)>> {
    let (sync_r, sync_w) = pipe().map_err(|e| format!("pipe: {e}"))?;
    // The warm interpreter's control socket becomes fd 3: the status pipe must not be there.
    let status_w = if spec.zygote_control.is_some() && status_w.as_raw_fd() <= 3 {
        // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd we own.
        let fd = unsafe { libc::fcntl(status_w.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if fd < 0 {
            return Err(format!("fcntl: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: fresh fd.
        unsafe { OwnedFd::from_raw_fd(fd) }
    } else {
        status_w
    };
    let argv_ptrs = spawn::ptr_array(spec.argv);
    let env_ptrs = spawn::ptr_array(spec.env);
    let plan = ChildPlan {
        paths: &slot.paths,
        run_mount_fd: fds.run_mount.as_raw_fd(),
        sync_read: sync_r.as_raw_fd(),
        status_write: status_w.as_raw_fd(),
        listener_sock: fds.listener_sock.as_raw_fd(),
        stdin_fd: fds.stdin.as_raw_fd(),
        stdout_fd: fds.stdout.as_raw_fd(),
        stderr_fd: fds.stderr.as_raw_fd(),
        rlimits: spec.rlimits,
        cap_last: shared.cap_last,
        box_id: BOX_ID,
        hostname: b"sandbox",
        cwd: spec.cwd,
        exec_paths: spec.exec_paths,
        argv: &argv_ptrs,
        envp: &env_ptrs,
        filter: &shared.filter,
        zygote_control: spec.zygote_control.map(|f| f.as_raw_fd()).unwrap_or(-1),
        work_mount_fd: spec.work_mount.map(|f| f.as_raw_fd()).unwrap_or(-1),
        stack2_top: slot.stack2.top(),
        init_path: &slot.init_path,
        host_dumpable: shared.host_dumpable,
        mount_cgroup2: spec.cgroup.is_some() && shared.cgroup_version == Some(cgroup::Version::V2),
    };
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    // SAFETY: plan and everything it points to live until this function returns, by which
    // time the child has exec'd or been reaped; the stack belongs to this slot, which launches
    // one child at a time; the slot thread blocks every signal.
    // The new user namespace is owned by the creator's effective uid: switch this thread
    // (raw setresuid: this thread only, not the whole process as glibc's wrapper would) to
    // the box's host uid around the clone. The saved uid stays 0, so switching back needs no
    // capability, and the effective capabilities come back with it.
    // SAFETY: setresuid with -1 for the ids left unchanged.
    if unsafe { libc::syscall(libc::SYS_setresuid, -1i32, spec.owner, -1i32) } < 0 {
        return Err(format!(
            "switching to the box's host uid: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: see above.
    let cloned = unsafe { spawn::clone_child(&plan, &slot.stack, flags) };
    // SAFETY: back to effective uid 0 (the saved uid).
    if unsafe { libc::syscall(libc::SYS_setresuid, -1i32, 0, -1i32) } < 0 {
        // The slot thread can no longer manage boxes; this must not happen.
        panic!(
            "cannot switch the slot thread back to root: {}",
            std::io::Error::last_os_error()
        );
    }
    if shared.host_dumpable {
        // Changing the effective uid cleared the process's (memory-wide) dumpable flag.
        // SAFETY: prctl with flags only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    }
    let (pid, pidfd) = cloned.map_err(|e| format!("clone: {e}"))?;
    // SAFETY: fresh pidfd from clone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(sync_r);
    drop(status_w);
    let abort = |why: String| {
        kill(pidfd.as_fd());
        supervise::reap(pid);
        why
    };
    // Identity maps: box users are unprivileged host ids, never host root.
    if let Err(e) = std::fs::write(format!("/proc/{pid}/uid_map"), &spec.id_map)
        .and_then(|_| std::fs::write(format!("/proc/{pid}/gid_map"), &spec.id_map))
    {
        return Err(abort(format!("writing the id maps: {e}")));
    }
    if let Some(cg) = spec.cgroup {
        if shared.cgroup_version == Some(cgroup::Version::V2) {
            if let Err(e) = cg.attach(pid) {
                return Err(abort(format!("attaching to the slot cgroup: {e}")));
            }
        }
    }
    // SAFETY: writing one byte from a valid buffer to our pipe.
    if unsafe { libc::write(sync_w.as_raw_fd(), b"g".as_ptr().cast(), 1) } != 1 {
        return Err(abort(format!(
            "releasing the child: {}",
            std::io::Error::last_os_error()
        )));
    }
    match read_status(status_r, Duration::from_secs(30)) {
        Err(e) => Err(abort(e)),
        Ok(None) => Ok(Ok((pid, pidfd))),
        Ok(Some((step @ (Step::Exec | Step::Chdir), errno))) => {
            supervise::reap(pid);
            Ok(Err((step, errno)))
        }
        Ok(Some((step, errno))) => {
            supervise::reap(pid);
            Err(format!(
                "box set-up failed at {}: {}",
                step.describe(),
                std::io::Error::from_raw_os_error(errno)
            ))
        }
    }
}

fn launch_cold(
    shared: &Shared,
    slot: &Slot,
    own_cg: Option<&cgroup::Slot>,
    run: &Prepared,
    fds: &ChildFds<'_>,
    status: (BorrowedFd<'_>, OwnedFd),
    sock_parent: BorrowedFd<'_>,
) -> RunResult<Launch> {
    // A run in a cgroup of its own (see `run_cgroup`) joins it; any other the slot's.
    let cg = own_cg.or(slot.cgroup.as_ref());
    let degraded = cg.is_none();
    let rlimits = crate::rlimit::for_limits(&run.limits, degraded);
    let spec = BoxSpec {
        argv: &run.argv,
        exec_paths: &run.exec_paths,
        env: &run.env,
        cwd: &run.cwd,
        rlimits: &rlimits,
        // The box's init is root of the user namespace on the slot's second host id; the
        // program is the box user on the first (or on the session's).
        id_map: format!(
            "0 {} 1\n{BOX_ID} {} 1\n",
            slot.zygote_host_id,
            run.session
                .as_ref()
                .map(|(_, id)| *id)
                .unwrap_or(slot.host_id)
        ),
        zygote_control: None,
        work_mount: run.session.as_ref().map(|(m, _)| m.as_fd()),
        owner: run
            .session
            .as_ref()
            .map(|(_, id)| *id)
            .unwrap_or(slot.host_id),
        cgroup: cg,
    };
    match clone_box(shared, slot, &spec, fds, status)? {
        Err((step, errno)) => Ok(Launch::ExecFailed(step, errno)),
        Ok((pid, pidfd)) => {
            let listener = receive_listener(sock_parent).inspect_err(|_| {
                kill(pidfd.as_fd());
                supervise::reap(pid);
            })?;
            let mnt_ns = mount_namespace(pidfd.as_fd());
            Ok(Launch::Live(Live {
                pidfd,
                kill: None,
                reaper: Reaper::Wait4(pid),
                listener,
                mnt_ns,
            }))
        }
    }
}

/// The mount namespace of a live process, from its pidfd (`PIDFD_GET_MNT_NAMESPACE`, Linux
/// 6.11+); `None` on older kernels, or if the process is gone already.
fn mount_namespace(pidfd: BorrowedFd<'_>) -> Option<OwnedFd> {
    // _IO(PIDFS_IOCTL_MAGIC = 0xFF, 3), from <linux/pidfd.h>.
    const PIDFD_GET_MNT_NAMESPACE: libc::c_ulong = 0xff03;
    // SAFETY: an ioctl without an argument on a valid fd; it returns a new fd or fails.
    let fd = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_MNT_NAMESPACE as _, 0) };
    // SAFETY: a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Receives the child's seccomp listener (sent just before it runs untrusted code).
pub(crate) fn receive_listener(sock: BorrowedFd<'_>) -> RunResult<OwnedFd> {
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
    let listener =
        seccomp::recv_fd(sock).map_err(|e| format!("receiving the seccomp listener: {e}"))?;
    set_nonblocking(listener.as_raw_fd());
    Ok(listener)
}

/// Reads the child's set-up status pipe: `None` at end of file (exec happened), or the step
/// that failed and its errno.
pub(crate) fn read_status(
    status_r: BorrowedFd<'_>,
    limit: Duration,
) -> RunResult<Option<(Step, i32)>> {
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
                ));
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
            return Err(format!("reading the child's status: {e}"));
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
        None => Err(format!(
            "box set-up failed at an unknown step {step}: errno {errno}"
        )),
    }
}

fn zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is plain old data; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The 4-byte wait status the box's init writes when the program exits, if any.
fn read_exit_record(status_r: BorrowedFd<'_>) -> Option<i32> {
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

/// Whether the run's cgroup (its own or the slot's) OOM-killed something in the run that just
/// ended.
fn oom_in(cg: Option<&cgroup::Slot>) -> bool {
    cg.and_then(|c| c.usage().ok())
        .is_some_and(|u| u.oom_killed)
}

/// A cgroup of its own for a cold run where the slot's cannot give the run's exact peak memory
/// (cgroup v2 on Linux 5.19–6.11, whose `memory.peak` cannot be reset): a fresh cgroup's
/// lifetime peak is the run's. Warm runs stay in the slot's cgroup: they are forked by the
/// warm interpreter there, and moving each into another cgroup would cost a cgroup migration
/// (and miss the pages it touched before the move).
fn run_cgroup(shared: &Shared, slot: &Slot, run: &Prepared) -> RunResult<Option<cgroup::Slot>> {
    let Some(cg) = slot.cgroup.as_ref() else {
        return Ok(None);
    };
    if run.warm || cg.peak_memory_mode() != cgroup::PeakMemory::LifetimeOnly {
        return Ok(None);
    }
    shared
        .run_cgroup(cg.index())
        .map_err(|e| format!("creating the run's cgroup: {e}"))
}

/// SIGKILL through a pidfd.
pub(crate) fn kill(pidfd: BorrowedFd<'_>) {
    // SAFETY: pidfd_send_signal on a valid pidfd with a NULL siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<u8>(),
            0,
        )
    };
}

/// Creates a pipe whose two ends are close-on-exec.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a valid fd.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// Makes the box user (host id `id`, uid and gid) the owner of the inode behind `fd`: the
/// pipes and memfd of its standard streams, which it may then reopen (`/dev/stdout`) as a
/// process may its own pipes on a host. Nothing else of the host runs under that id.
fn give_to(fd: BorrowedFd<'_>, id: u32) -> std::io::Result<()> {
    // SAFETY: fchown on a valid fd changes only that inode's owner.
    if unsafe { libc::fchown(fd.as_raw_fd(), id, id) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A close-on-exec memfd holding `data`, positioned at its start.
pub(crate) fn memfd_with(data: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = crate::sys::memfd_create(c"agentrl", libc::MFD_CLOEXEC)?;
    let fd = crate::mounts::write_all(fd, data)?;
    // SAFETY: valid fd.
    unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_SET) };
    Ok(fd)
}

pub(crate) fn thread_cpu_ns() -> u64 {
    // SAFETY: timespec is plain old data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn tv(t: &libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence() {
        let c = |oom, killed, sig, code, cpu, trunc, pids| {
            classify(oom, killed, sig, code, cpu, trunc, pids)
        };
        assert_eq!(
            c(true, Some(Kill::WallTime), Some(9), None, true, true, true).0,
            Status::MemoryLimit
        );
        assert_eq!(
            c(
                false,
                Some(Kill::WallTime),
                Some(9),
                None,
                true,
                true,
                false
            )
            .1,
            Some(LimitKind::WallTime)
        );
        assert_eq!(
            c(false, None, Some(libc::SIGXCPU), None, false, false, false).1,
            Some(LimitKind::CpuTime)
        );
        assert_eq!(
            c(false, None, Some(9), None, true, false, false).0,
            Status::Timeout
        );
        assert_eq!(
            c(false, None, Some(9), None, false, false, false).0,
            Status::Signaled
        );
        assert_eq!(
            c(false, None, None, Some(0), false, true, false).0,
            Status::OutputLimit
        );
        assert_eq!(
            c(false, None, Some(libc::SIGXFSZ), None, false, false, false).1,
            Some(LimitKind::FileSize)
        );
        assert_eq!(
            c(false, None, None, Some(2), false, false, true),
            (Status::RuntimeError, Some(LimitKind::Pids))
        );
        assert_eq!(
            c(false, None, None, Some(0), false, false, false),
            (Status::Ok, None)
        );
    }
}
