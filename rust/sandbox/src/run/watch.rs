//! The watch phase ([`watch`]): from the start of the program to its end, the supervisor
//! reads its output, enforces the wall-clock and CPU limits, answers its denied system calls
//! and heeds a cancellation (see `crate::supervise`).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::error::Cause;
use super::launch::{Output, Running};
use super::place::Placement;
use super::thread_cpu_ns;
use crate::cgroup;
use crate::sandbox::{Prepared, Slot};
use crate::supervise::{self, Capture, Kill};

/// What the watch phase saw.
pub(super) struct Watched {
    /// How the supervisor ended the run, if it did, and the system calls it denied.
    pub supervised: supervise::Watch,
    pub out: Capture,
    pub err: Capture,
    /// The live-output writer, if the caller asked for one.
    pub tee: Option<crate::tee::Tee>,
    /// Wall-clock time from the start of the program to its end.
    pub wall: f64,
}

impl Watched {
    /// Whether the run may have a verdict: not if the caller cancelled it (checked once its box
    /// is collected, so that what it left is freed as after any other run).
    pub(super) fn not_cancelled(&self) -> Result<(), Cause> {
        if self.supervised.killed == Some(Kill::Cancelled) {
            return Err("the run was cancelled".into());
        }
        Ok(())
    }
}

/// The watch phase: supervises the running box until it ends, capturing `output` (and
/// copying it to the live-output writer, if any).
pub(super) fn watch(
    slot: &Slot,
    run: &Prepared,
    placed: &Placement,
    running: &Running,
    output: Output,
) -> Watched {
    let l = &run.limits;
    let live = &running.live;
    let started = Instant::now();
    let mut out = Capture::new(output.out_r, l.max_output_bytes);
    let mut err = Capture::new(output.err_r, l.max_output_bytes);
    let tee = match run.tee.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some((tee, o, e)) => {
            (out.tee, err.tee) = (Some(o), Some(e));
            Some(tee)
        }
        None => None,
    };
    let cg = placed.cgroup(slot);
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
        Some(ns.saturating_sub(thread_cpu_ns().saturating_sub(placed.thread_cpu0)))
    };
    let supervised = supervise::watch(
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
    Watched {
        supervised,
        out,
        err,
        tee,
        wall,
    }
}
