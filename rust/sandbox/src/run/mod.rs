//! One run in a slot: per-run I/O, launching the box (cold: a new clone; warm: a fork of the
//! slot's warm interpreter), watching it, and the verdict, in named phases (see `run_inner`);
//! a failure is a [`RunError`] that names its phase, and becomes a `sandbox_error` verdict.
//!
//! Whatever the slot can do before or after the caller's wait (from submission to verdict) it
//! does there: the next run's channels are made after the previous verdict, and a cold box's
//! mount namespace (whose teardown waits for an RCU grace period) is freed after its verdict
//! is delivered ([`Between`], [`between_runs`]). The details are in `docs/design/run.md`.
//!
//! Layout, by phase: `channels` (I/O; the work between runs), `place` (the run's cgroup),
//! `launch` (the box, and [`clone_box`]), `watch`, `collect`, `verdict` (measuring and
//! classifying); and `error` ([`RunError`]), `status` (what the box reports on its pipes and
//! socket), `fds` (fd helpers), `tests`.

use crate::sandbox::{Prepared, Shared, Slot};
use crate::verdict::ExecResult;
use crate::warm;

mod channels;
mod collect;
mod error;
mod fds;
mod launch;
mod place;
mod status;
#[cfg(test)]
mod tests;
mod verdict;
mod watch;

pub(crate) use channels::{between_runs, Between};
pub(crate) use error::{Cause, Phase, RunError};
pub(crate) use fds::{kill, memfd_with, pipe};
pub(crate) use launch::{clone_box, BoxSpec, ChildFds, Launch, Live, Reaper};
pub(crate) use status::{read_status, receive_listener};

use error::at;
use launch::Launched;

/// Runs one prepared request in `slot`; infrastructure failures become `sandbox_error`.
pub(crate) fn run_in_slot(shared: &Shared, slot: &mut Slot, run: &Prepared) -> ExecResult {
    match run_inner(shared, slot, run) {
        Ok(r) => r,
        Err(e) => ExecResult::sandbox_error(crate::rlimit::explain_fd_exhaustion(e.to_string())),
    }
}

/// A run as a sequence of phases (start, I/O, placement, launch, watch, collection,
/// measure), each a function of its own; a phase's failure comes back named by its phase.
fn run_inner(shared: &Shared, slot: &mut Slot, run: &Prepared) -> Result<ExecResult, RunError> {
    start(shared, slot, run).map_err(at(Phase::Start))?;
    let io = channels::prepare(slot, run).map_err(at(Phase::Io))?;
    let placed = place::place(shared, slot, run).map_err(at(Phase::Place))?;
    let (running, output) = match launch::launch(shared, slot, run, io, &placed) {
        Ok(Launched::Running(running, output)) => (running, output),
        Ok(Launched::CannotExecute(verdict)) => return Ok(verdict),
        Err(cause) => return Err(cause.at(Phase::Launch)),
    };
    let watched = watch::watch(slot, run, &placed, &running, output);
    let ended =
        collect::collect(slot, run, &placed, running, &watched).map_err(at(Phase::Collect))?;
    watched.not_cancelled().map_err(at(Phase::Watch))?;
    verdict::measure(slot, run, placed, watched, ended).map_err(at(Phase::Measure))
}

/// The start phase: a warm run needs a warm interpreter (configured, and live in the slot:
/// started now if it is not), and a run cancelled while it waited does not start.
fn start(shared: &Shared, slot: &mut Slot, run: &Prepared) -> Result<(), Cause> {
    if run.warm && shared.config.warm.is_none() {
        return Err("the warm interpreter is not configured for this sandbox".into());
    }
    if cancelled(run) {
        return Err("the run was cancelled before it started".into());
    }
    if run.warm {
        warm::ensure(shared, slot)?;
    }
    Ok(())
}

fn cancelled(run: &Prepared) -> bool {
    run.cancel
        .as_ref()
        .is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst))
}

/// CPU time of the calling thread (the slot's), in nanoseconds.
fn thread_cpu_ns() -> u64 {
    // SAFETY: timespec is plain old data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
