//! The job table: fixed slots, a lock-free free list, priority lanes and the
//! completion queue, tied together by a per-slot atomic state word.
//!
//! This is the lock-free heart of the pool, kept free of threads, parking and
//! file descriptors so that loom can model it (`tests/loom.rs`).
//!
//! A slot's state word is `generation << 32 | flags`; every transition on
//! behalf of a [`JobId`] is a CAS that also checks the generation, and the
//! flags' state machine gives each job exactly one result. The design (slots
//! and ids, the state machine, memory orderings, kill hooks) is in
//! `docs/design/scheduler.md`.
//!
//! Layout: this file holds the state machine ([`Table`], [`Claimed`]); `token`
//! the per-slot kill hooks and the cancellation handles ([`CancelToken`],
//! [`KillHookGuard`], [`CancelSource`]).

mod token;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::job::{JobId, JobSpec, Outcome, OutcomeKind};
use crate::pad::CachePadded;
use crate::queue::ArrayQueue;
use crate::sync::{spin_hint, Ordering, UnsafeCell};

use self::token::SlotSync;
pub use self::token::{CancelSource, CancelToken, KillHookGuard};

const IN_LANE: u64 = 1;
const RUNNING: u64 = 2;
const CANCEL_REQ: u64 = 4;
const FINISHING: u64 = 8;
const TERMINAL: u64 = 16;
const DRAINED: u64 = 32;
const FLAGS: u64 = 0xffff_ffff;
const GEN: u64 = !FLAGS;

struct Slot<J, R> {
    sync: SlotSync,
    /// Payload and deadline: written by the submitter, read by the claiming
    /// worker, dropped by the finisher or by the canceller of a queued job.
    job: UnsafeCell<Option<(J, Option<Instant>)>>,
    /// Written by the publisher of the terminal result, taken by the drainer.
    outcome: UnsafeCell<Option<Outcome<R>>>,
}

/// See `docs/design/scheduler.md`.
pub struct Table<J, R> {
    slots: Box<[CachePadded<Slot<J, R>>]>,
    free: ArrayQueue<u32>,
    lanes: Box<[ArrayQueue<u64>]>,
    done: ArrayQueue<u64>,
}

// SAFETY: the cells inside slots are only accessed by the party that the
// state machine (docs/design/scheduler.md) makes their owner, with ownership
// handed over through Release/Acquire pairs, so sharing `&Table` between
// threads is sound as long as payloads and outcomes may move between threads
// (`Send`).
unsafe impl<J: Send, R: Send> Sync for Table<J, R> {}
// SAFETY: as above; the table owns `J`s and `R`s, which are `Send`.
unsafe impl<J: Send, R: Send> Send for Table<J, R> {}

/// What [`Table::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The job was queued; its `Cancelled` result is already published.
    Queued,
    /// The job was running; cancellation was requested and the kill hook (if
    /// any) fired; the worker will publish `Cancelled`.
    Running,
    /// Unknown id, already finished or finishing, or already cancelled.
    No,
}

/// What [`Table::next`] found.
pub enum Next<'t, J, R> {
    /// A job, now owned by the caller until [`Claimed::finish`].
    Job(Claimed<'t, J, R>),
    /// A lane entry of a job cancelled while queued (nothing to run).
    Skipped,
    /// All lanes were empty.
    Empty,
}

impl<J, R> Table<J, R> {
    /// A table of `capacity` slots (1 ..= `u32::MAX`) and `lanes` lanes (>= 1).
    pub fn new(capacity: usize, lanes: usize) -> Self {
        assert!(capacity >= 1 && capacity <= u32::MAX as usize);
        assert!(lanes >= 1);
        let slots = (0..capacity)
            .map(|_| {
                CachePadded::new(Slot {
                    sync: SlotSync::new(0),
                    job: UnsafeCell::new(None),
                    outcome: UnsafeCell::new(None),
                })
            })
            .collect();
        let free = ArrayQueue::new(capacity);
        for i in 0..capacity {
            if free.push(i as u32).is_err() {
                unreachable!("free list sized for all slots");
            }
        }
        Self {
            slots,
            free,
            lanes: (0..lanes).map(|_| ArrayQueue::new(capacity)).collect(),
            done: ArrayQueue::new(capacity),
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Takes a free slot, stores the job and queues it on `lane`
    /// (`0..lanes()`; higher is served first). Gives the spec back if no slot
    /// is free.
    pub fn try_submit(&self, spec: JobSpec<J>, lane: usize) -> Result<JobId, JobSpec<J>> {
        let Some(idx) = self.free.pop() else {
            return Err(spec);
        };
        let slot = &self.slots[idx as usize];
        // Relaxed: the free-list pop (Acquire) ordered us after the release.
        let old = slot.sync.state.load(Ordering::Relaxed);
        debug_assert_eq!(old & FLAGS, 0, "slot on the free list is not free");
        let mut gen = ((old >> 32) as u32).wrapping_add(1);
        if gen == 0 {
            gen = 1;
        }
        let id = (u64::from(gen) << 32) | u64::from(idx);
        slot.sync.group.store(spec.group, Ordering::Relaxed);
        // SAFETY: the slot is free and we popped its index from the free
        // list, so no other thread accesses its cells until the Release
        // store below publishes it.
        slot.job
            .with_mut(|p| unsafe { *p = Some((spec.payload, spec.deadline)) });
        slot.sync
            .state
            .store((id & GEN) | IN_LANE, Ordering::Release);
        push_spin(&self.lanes[lane], id);
        Ok(JobId(id))
    }

    /// Pops the next lane entry, highest lane first, and claims its job.
    pub fn next(&self) -> Next<'_, J, R> {
        for lane in self.lanes.iter().rev() {
            if let Some(id) = lane.pop() {
                return self.claim(id);
            }
        }
        Next::Empty
    }

    fn claim(&self, id: u64) -> Next<'_, J, R> {
        let idx = id as u32 as usize;
        let slot = &self.slots[idx];
        let mut cur = slot.sync.state.load(Ordering::Acquire);
        loop {
            debug_assert_eq!(cur & GEN, id & GEN, "lane entry outlived its job");
            debug_assert_ne!(cur & IN_LANE, 0);
            if cur & FLAGS == IN_LANE {
                match slot.sync.state.compare_exchange(
                    cur,
                    (cur & GEN) | RUNNING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // SAFETY: we own the RUNNING job; the submitter's
                        // write is visible through the Acquire above.
                        let deadline = slot
                            .job
                            .with(|p| unsafe { (*p).as_ref().and_then(|j| j.1) });
                        return Next::Job(Claimed {
                            table: self,
                            idx,
                            id,
                            deadline,
                            finished: false,
                        });
                    }
                    Err(actual) => cur = actual,
                }
            } else {
                // Cancelled while queued: this lane entry was the last-but-one
                // or last reference to the slot.
                let cleared = cur & !IN_LANE;
                let release = cleared & FLAGS == TERMINAL | DRAINED;
                let new = if release { cleared & GEN } else { cleared };
                match slot.sync.state.compare_exchange(
                    cur,
                    new,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        if release {
                            push_spin(&self.free, idx as u32);
                        }
                        return Next::Skipped;
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
    }

    fn finish_slot(&self, idx: usize, id: u64, outcome: Outcome<R>) -> OutcomeKind {
        let slot = &self.slots[idx];
        let prev = slot.sync.state.fetch_or(FINISHING, Ordering::AcqRel);
        debug_assert_eq!(prev & GEN, id & GEN);
        debug_assert_eq!(prev & (RUNNING | FINISHING), RUNNING);
        let cancelled = prev & CANCEL_REQ != 0;
        if cancelled || slot.sync.hook_set.load(Ordering::Relaxed) {
            slot.sync.clear_hook();
        }
        let outcome = if cancelled {
            drop_quietly(outcome);
            Outcome::Cancelled
        } else {
            outcome
        };
        // SAFETY: we own the running job's cells until the Release store of
        // TERMINAL below; cancellers never touch cells of a RUNNING job.
        let job = slot.job.with_mut(|p| unsafe { (*p).take() });
        drop_quietly(job);
        let kind = outcome.kind();
        // SAFETY: as above; the outcome cell was emptied by the last drain.
        slot.outcome.with_mut(|p| unsafe { *p = Some(outcome) });
        slot.sync
            .state
            .store((id & GEN) | TERMINAL, Ordering::Release);
        push_spin(&self.done, id);
        kind
    }

    /// Cancels job `id`: see [`Cancel`].
    pub fn cancel(&self, id: JobId) -> Cancel {
        let id = id.0;
        let idx = id as u32 as usize;
        if id & GEN == 0 || idx >= self.slots.len() {
            return Cancel::No;
        }
        let slot = &self.slots[idx];
        let mut cur = slot.sync.state.load(Ordering::Acquire);
        loop {
            if cur & GEN != id & GEN {
                return Cancel::No;
            }
            let flags = cur & FLAGS;
            if flags == IN_LANE {
                match slot.sync.state.compare_exchange(
                    cur,
                    cur | TERMINAL,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // SAFETY: TERMINAL on a queued job makes us the owner
                        // of its cells (the worker's claim CAS now fails, and
                        // the drainer only comes after the push below).
                        let job = slot.job.with_mut(|p| unsafe { (*p).take() });
                        drop_quietly(job);
                        // SAFETY: as above.
                        slot.outcome
                            .with_mut(|p| unsafe { *p = Some(Outcome::Cancelled) });
                        push_spin(&self.done, id);
                        return Cancel::Queued;
                    }
                    Err(actual) => cur = actual,
                }
            } else if flags & RUNNING != 0 && flags & (CANCEL_REQ | FINISHING) == 0 {
                match slot.sync.state.compare_exchange(
                    cur,
                    cur | CANCEL_REQ,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        slot.sync.fire_hook(id & GEN);
                        return Cancel::Running;
                    }
                    Err(actual) => cur = actual,
                }
            } else {
                return Cancel::No;
            }
        }
    }

    /// Cancels every queued or running job whose group satisfies `pred`.
    /// Returns `(queued, running)` counts of jobs this call cancelled.
    ///
    /// Two passes over the slots, O(capacity): queued jobs first, then
    /// running ones, so a worker freed by killing a running job cannot start
    /// a queued job of the group before the scan reaches it. A job that
    /// starts during the first pass is caught by the second unless it has
    /// already finished; jobs submitted concurrently may escape.
    pub fn cancel_where(&self, mut pred: impl FnMut(u64) -> bool) -> (usize, usize) {
        let (mut queued, mut running) = (0, 0);
        for pass_running in [false, true] {
            for (idx, slot) in self.slots.iter().enumerate() {
                let cur = slot.sync.state.load(Ordering::Acquire);
                let flags = cur & FLAGS;
                let candidate = if pass_running {
                    flags & RUNNING != 0 && flags & (CANCEL_REQ | FINISHING) == 0
                } else {
                    flags == IN_LANE
                };
                if !candidate || !pred(slot.sync.group.load(Ordering::Relaxed)) {
                    continue;
                }
                match self.cancel(JobId((cur & GEN) | idx as u64)) {
                    Cancel::Queued => queued += 1,
                    Cancel::Running => running += 1,
                    Cancel::No => {}
                }
            }
        }
        (queued, running)
    }

    /// Pops one published result, freeing its slot if the lane no longer
    /// references it.
    pub fn pop_done(&self) -> Option<(JobId, Outcome<R>)> {
        let id = self.done.pop()?;
        let idx = id as u32 as usize;
        let slot = &self.slots[idx];
        // SAFETY: the completion pop (Acquire) made us the owner of the
        // outcome written before the publisher's Release push.
        let outcome = slot.outcome.with_mut(|p| unsafe { (*p).take() });
        let mut cur = slot.sync.state.load(Ordering::Acquire);
        loop {
            debug_assert_eq!(cur & GEN, id & GEN);
            debug_assert_ne!(cur & TERMINAL, 0);
            if cur & IN_LANE != 0 {
                match slot.sync.state.compare_exchange(
                    cur,
                    cur | DRAINED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(actual) => cur = actual,
                }
            } else {
                // Last reference: no other party can change the state now.
                slot.sync.state.store(cur & GEN, Ordering::Release);
                push_spin(&self.free, idx as u32);
                break;
            }
        }
        let outcome = outcome.unwrap_or_else(|| {
            Outcome::Failed("internal error: terminal job without outcome".to_owned())
        });
        Some((JobId(id), outcome))
    }

    /// True if any lane has an entry (claimed positions count).
    pub fn has_queued(&self) -> bool {
        self.lanes.iter().any(|l| !l.is_empty())
    }

    /// Approximate depth of each lane (includes entries of jobs cancelled
    /// while queued that no worker has skipped yet).
    pub fn lane_depths(&self) -> Vec<usize> {
        self.lanes.iter().map(|l| l.len()).collect()
    }

    /// True if a published result is waiting to be drained.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Number of results waiting to be drained.
    pub fn done_len(&self) -> usize {
        self.done.len()
    }

    /// True if a slot is free.
    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }
}

impl<J, R> fmt::Debug for Table<J, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("capacity", &self.slots.len())
            .field("lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

/// A running job, owned by the worker that claimed it. Dropping it without
/// [`finish`](Claimed::finish) (e.g. on an internal panic) publishes
/// `Failed`, so the job still gets exactly one result.
pub struct Claimed<'t, J, R> {
    table: &'t Table<J, R>,
    idx: usize,
    id: u64,
    deadline: Option<Instant>,
    finished: bool,
}

impl<J, R> Claimed<'_, J, R> {
    /// The job's id.
    #[cfg_attr(not(loom), allow(dead_code))]
    pub fn id(&self) -> JobId {
        JobId(self.id)
    }

    /// The job's deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The job's payload.
    pub fn payload(&self) -> &J {
        let slot = &self.table.slots[self.idx];
        // SAFETY: while `self` exists the job is RUNNING and owned by us; the
        // payload is only taken in `finish`, which consumes `self`, so the
        // reference cannot outlive it.
        slot.job.with(|p| unsafe {
            match &*p {
                Some((job, _)) => &*(job as *const J),
                None => unreachable!("running job without payload"),
            }
        })
    }

    /// True once cancellation has been requested.
    pub fn cancel_requested(&self) -> bool {
        self.table.slots[self.idx]
            .sync
            .state
            .load(Ordering::Acquire)
            & CANCEL_REQ
            != 0
    }

    /// The token handed to the executor for attempt number `attempt`
    /// (0-based).
    pub fn token(&self, attempt: u32) -> CancelToken<'_> {
        let sync = &self.table.slots[self.idx].sync;
        CancelToken {
            sync,
            gen: self.id & GEN,
            id: JobId(self.id),
            group: sync.group.load(Ordering::Relaxed),
            attempt,
            deadline: self.deadline,
        }
    }

    /// Publishes the job's result. If cancellation was requested before
    /// this call, `Cancelled` is published instead (and `outcome` dropped).
    /// Returns the kind actually published.
    pub fn finish(mut self, outcome: Outcome<R>) -> OutcomeKind {
        self.finished = true;
        self.table.finish_slot(self.idx, self.id, outcome)
    }
}

impl<J, R> Drop for Claimed<'_, J, R> {
    fn drop(&mut self) {
        if !self.finished {
            self.table.finish_slot(
                self.idx,
                self.id,
                Outcome::Failed("internal error: job abandoned by its worker".to_owned()),
            );
        }
    }
}

/// Pushes into a queue that is known to have room (see
/// docs/design/scheduler.md, "Slots and ids"), retrying across the transient
/// "full" of a pre-empted consumer.
fn push_spin<T>(q: &ArrayQueue<T>, mut value: T) {
    loop {
        match q.push(value) {
            Ok(()) => return,
            Err(back) => {
                value = back;
                spin_hint();
            }
        }
    }
}

/// Drops a user value, swallowing a panic from its `Drop` so that the
/// scheduler's bookkeeping always completes.
pub(crate) fn drop_quietly<T>(value: T) {
    if std::mem::needs_drop::<T>() {
        let _ = catch_unwind(AssertUnwindSafe(move || drop(value)));
    }
}
