//! The collection phase ([`collect`]): once the box has ended, its files are collected and its
//! file system freed (its pages stay charged to the slot until then), its exit is reaped (by
//! this thread, or reported by the warm interpreter), and what it left is deferred until the
//! caller has the verdict.

use std::os::fd::AsFd;

use super::error::Cause;
use super::launch::{Reaper, Running};
use super::place::Placement;
use super::status::read_exit_record;
use super::watch::Watched;
use crate::cgroup;
use crate::sandbox::{Prepared, Slot};
use crate::supervise;
use crate::warm;

/// What the collection phase gives.
pub(super) struct Ended {
    /// The program's wait status and resource usage.
    pub exit: supervise::Exit,
    /// The collected files, by the name the caller asked for them.
    pub files: Vec<(String, Vec<u8>)>,
    /// The names of the collected files that were cut at the file size limit.
    pub truncated_files: Vec<String>,
    /// Whether the run was forked by the warm interpreter.
    pub was_warm: bool,
}

/// The collection phase: collects the ended box of `running` (see the module doc). An end
/// that nothing explains (no exit report, while neither the supervisor nor the memory limit
/// killed the box) is an error.
pub(super) fn collect(
    slot: &mut Slot,
    run: &Prepared,
    placed: &Placement,
    running: Running,
    watched: &Watched,
) -> Result<Ended, Cause> {
    let l = &run.limits;
    let Running {
        live,
        runfs,
        status_r,
        sock_parent,
    } = running;
    let killed = watched.supervised.killed;
    // A warm run's interpreter reaps the program and then its init: once it has reported,
    // nothing of the run is left to touch its files. It waits (allocating nothing) until
    // the files are freed below.
    let was_warm = matches!(live.reaper, Reaper::WarmInterpreter);
    let warm_exit = match live.reaper {
        Reaper::WarmInterpreter => Some(warm::wait_exit(slot)),
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
                None if killed.is_none() && !oom_in(placed.cgroup(slot)) => {
                    return Err(format!(
                        "the box ended without its init's report (init wait status {:#x})",
                        exit.wait_status
                    )
                    .into());
                }
                None => {}
            }
            exit
        }
        (Reaper::WarmInterpreter, Some(Ok(exit))) => {
            if warm::release(slot).is_err() {
                warm::discard(slot);
            }
            exit
        }
        (Reaper::WarmInterpreter, other) => {
            // The interpreter died (a run that filled the slot's memory can take it down
            // with it), killing the run with it. It is replaced for the next run; this run's
            // verdict stands only if the supervisor or the memory limit ended it.
            warm::discard(slot);
            if killed.is_none() && !oom_in(placed.cgroup(slot)) {
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
    Ok(Ended {
        exit,
        files,
        truncated_files,
        was_warm,
    })
}

/// Whether the run's cgroup (its own or the slot's) OOM-killed something in the run that just
/// ended.
fn oom_in(cg: Option<&cgroup::Slot>) -> bool {
    cg.and_then(|c| c.usage().ok())
        .is_some_and(|u| u.oom_killed)
}

fn zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is plain old data; all-zero is valid.
    unsafe { std::mem::zeroed() }
}
