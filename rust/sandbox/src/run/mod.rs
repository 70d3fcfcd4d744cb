//! One run in a slot: per-run I/O, launching the box (cold: a new clone; warm: a fork of the
//! slot's warm interpreter), watching it, and the verdict.
//!
//! Whatever the slot can do before or after the caller's wait (from submission to verdict) it
//! does there: the next run's channels are made after the previous verdict, and a cold box's
//! mount namespace (whose teardown waits for an RCU grace period) is freed after its verdict
//! is delivered ([`Between`], [`between_runs`]). The details are in `docs/design/run.md`.
//!
//! Layout: `io` (the run's channels, the work between runs), `launch` (the cold launch and
//! [`clone_box`]), `status` (what the box reports on its pipes and socket), `verdict`
//! (classifying the end), `fds` (fd helpers), `tests`.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::cgroup;
use crate::sandbox::{Prepared, Shared, Slot};
use crate::spawn::Step;
use crate::supervise::{self, Capture, Kill};
use crate::verdict::{ExecResult, Status};
use crate::zygote;

mod fds;
mod io;
mod launch;
mod status;
#[cfg(test)]
mod tests;
mod verdict;

pub(crate) use fds::{kill, memfd_with, pipe};
pub(crate) use io::{between_runs, Between};
use io::{Channels, RunIo};
use launch::launch_cold;
pub(crate) use launch::{clone_box, BoxSpec, ChildFds, Launch, Live, Reaper};
use status::read_exit_record;
pub(crate) use status::{read_status, receive_listener};
use verdict::classify;

pub(crate) type RunResult<T> = std::result::Result<T, String>;

/// Runs one prepared request in `slot`; infrastructure failures become `sandbox_error`.
pub(crate) fn run_in_slot(shared: &Shared, slot: &mut Slot, run: &Prepared) -> ExecResult {
    match run_inner(shared, slot, run) {
        Ok(r) => r,
        Err(e) => ExecResult::sandbox_error(crate::rlimit::explain_fd_exhaustion(e)),
    }
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

fn zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is plain old data; all-zero is valid.
    unsafe { std::mem::zeroed() }
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
pub(super) fn run_cgroup(
    shared: &Shared,
    slot: &Slot,
    run: &Prepared,
) -> RunResult<Option<cgroup::Slot>> {
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
