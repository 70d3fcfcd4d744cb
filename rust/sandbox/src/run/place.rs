//! The placement phase ([`place`]): which cgroup a run goes in (the slot's, or for a cold run
//! where the slot's cannot give the run's exact peak, a fresh one of its own), with the run's
//! limits, and what the slot's warm interpreter holds there ([`Placement`]).

use super::error::Cause;
use super::thread_cpu_ns;
use crate::cgroup;
use crate::sandbox::{Prepared, Shared, Slot};
use crate::warm;

/// Where a run is placed.
pub(super) struct Placement {
    /// The run's own cgroup (see [`run_cgroup`]); `None`: the slot's (or none, degraded).
    pub own_cg: Option<cgroup::Slot>,
    /// What the slot's warm interpreter holds in the slot's cgroup: added to the run's memory
    /// limit there and taken off its peak.
    pub baseline: u64,
    /// The slot thread's CPU time once the run was placed: what it spends from then on is
    /// taken off the cgroup's figure (on cgroup v1 the slot thread is a member).
    pub thread_cpu0: u64,
}

impl Placement {
    /// The cgroup the run is in: its own, or the slot's.
    pub(super) fn cgroup<'a>(&'a self, slot: &'a Slot) -> Option<&'a cgroup::Slot> {
        self.own_cg.as_ref().or(slot.cgroup.as_ref())
    }
}

/// The placement phase: forgets a warm interpreter that died before a cold run, then gives the
/// run's cgroup (its own, or the slot's) the run's limits and resets its figures.
pub(super) fn place(shared: &Shared, slot: &mut Slot, run: &Prepared) -> Result<Placement, Cause> {
    let l = &run.limits;
    if !run.warm
        && slot
            .interpreter
            .as_ref()
            .is_some_and(|z| !warm::is_alive(z))
    {
        warm::discard(slot);
    }
    // A live warm interpreter holds memory and a pid in the slot's cgroup whichever kind of
    // run comes next: that is the slot's baseline, added to the run's limits and taken off
    // its peak, so that a cold run after a warm one gets the same limits as in a fresh slot.
    let baseline = slot
        .interpreter
        .as_ref()
        .map(|z| z.baseline_memory)
        .unwrap_or(0);
    let mut own_cg = run_cgroup(shared, slot, run)?;
    if let Some(cg) = &mut own_cg {
        cg.set_limits(Some(l.memory_bytes), Some(l.max_pids))
            .map_err(Cause::cgroup("run cgroup limits"))?;
        cg.prepare_run()
            .map_err(Cause::cgroup("run cgroup reset"))?;
    }

    // Otherwise the run is in the slot's cgroup, which gets the run's limits.
    if let Some(cg) = slot.cgroup.as_mut().filter(|_| own_cg.is_none()) {
        // Extra pids: on cgroup v1 the slot thread is a member; the warm interpreter is one.
        let extra = u64::from(shared.cgroup_version == Some(cgroup::Version::V1))
            + u64::from(slot.interpreter.is_some());
        cg.set_limits(Some(l.memory_bytes + baseline), Some(l.max_pids + extra))
            .map_err(Cause::cgroup("cgroup limits"))?;
        cg.prepare_run().map_err(Cause::cgroup("cgroup reset"))?;
    }
    Ok(Placement {
        own_cg,
        baseline,
        thread_cpu0: thread_cpu_ns(),
    })
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
) -> Result<Option<cgroup::Slot>, Cause> {
    let Some(cg) = slot.cgroup.as_ref() else {
        return Ok(None);
    };
    if run.warm || cg.peak_memory_mode() != cgroup::PeakMemory::LifetimeOnly {
        return Ok(None);
    }
    shared
        .run_cgroup(cg.index())
        .map_err(Cause::cgroup("creating the run's cgroup"))
}
