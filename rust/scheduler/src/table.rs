//! The job table: fixed slots, a lock-free free list, priority lanes and the
//! completion queue, tied together by a per-slot atomic state word.
//!
//! This is the lock-free heart of the pool, kept free of threads, parking and
//! file descriptors so that loom can model it (`tests/loom.rs`).
//!
//! # Slots and ids
//!
//! The table owns `capacity` slots. A job occupies one slot from submission
//! until its result has been drained **and** its lane entry has been popped;
//! the free list (a [`ArrayQueue`] of slot indices) is therefore the admission
//! control: no free slot = the pool is full. Every queue in the table (lanes,
//! completion, free list) holds at most one entry per occupied slot, so a push
//! into any of them can never find it full (a transient "full" caused by a
//! pre-empted consumer is retried).
//!
//! A slot's state word is `generation << 32 | flags`. The generation is bumped
//! when the slot is handed out, and a [`JobId`] is `generation << 32 | index`,
//! so every transition on behalf of an id is a CAS that also checks the
//! generation: an operation on a stale id (a job that has finished and whose
//! slot was reused) fails instead of touching the new job.
//!
//! # State machine (flags)
//!
//! ```text
//! submit:    FREE ──────────────────────────────► IN_LANE
//! worker:    IN_LANE ──claim (CAS)──────────────► RUNNING
//! cancel:    IN_LANE ──(CAS)────────────────────► IN_LANE|TERMINAL   (result Cancelled published by the canceller)
//! cancel:    RUNNING ──(CAS)────────────────────► RUNNING|CANCEL_REQ (kill hook fired)
//! worker:    RUNNING[|CANCEL_REQ] ─fetch_or─────► …|FINISHING        (decides the outcome; CANCEL_REQ => Cancelled)
//! worker:    …|FINISHING ──store────────────────► TERMINAL           (result published)
//! worker:    IN_LANE|TERMINAL[|DRAINED] ─CAS────► clears IN_LANE      (stale lane entry of a cancelled job popped)
//! drain:     TERMINAL|IN_LANE ──CAS─────────────► …|DRAINED
//! last of drain / lane pop: ───────────────────► FREE, index pushed back on the free list
//! ```
//!
//! Exactly one terminal result per job: the result is published by whoever
//! sets `TERMINAL` (the canceller of a queued job) or `FINISHING` (the worker),
//! and both are single CASes/RMWs from states that exclude each other:
//! a queued job is either claimed (`IN_LANE -> RUNNING`) or cancelled
//! (`IN_LANE -> IN_LANE|TERMINAL`), never both; a running job accepts
//! `CANCEL_REQ` only until `FINISHING` is set, and the worker reads
//! `CANCEL_REQ` in the same RMW that sets `FINISHING`. Hence
//! [`Table::cancel`] returning `Queued` or `Running` is a promise that the
//! job's outcome is [`Outcome::Cancelled`].
//!
//! # Memory orderings
//!
//! * Payload, deadline and outcome live in `UnsafeCell`s owned by whichever
//!   party the state machine designates; ownership moves only through
//!   `Release`/`Acquire` pairs: the submitter's `Release` store of `IN_LANE`
//!   (and the lane push) before a worker's or canceller's `Acquire`; the
//!   finisher's `Release` completion push before the drainer's `Acquire` pop;
//!   the releaser's free-list push before the next submitter's pop.
//! * All state CASes/RMWs are `AcqRel`, so the two parties whose last
//!   reference frees a slot (drainer and lane popper) synchronise with each
//!   other before the slot goes back on the free list.
//! * `group` is only a hint for group cancellation (the CAS on the generation
//!   decides), so it is `Relaxed`.
//!
//! # Kill hooks
//!
//! Each slot has a mutex-protected kill hook registered by the executor
//! through [`CancelToken::on_cancel`]. A canceller that wins `CANCEL_REQ`
//! takes the mutex, re-checks that the same generation is still running and
//! not finishing, and calls the hook *under the mutex*. Unregistering (guard
//! drop) and the worker's end-of-job cleanup take the same mutex, so a hook is
//! never called after its guard was dropped or for a later job of the slot.
//! The mutex is uncontended and only touched when a hook is registered or a
//! running job is cancelled.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::job::{JobId, JobSpec, Outcome, OutcomeKind};
use crate::pad::CachePadded;
use crate::queue::ArrayQueue;
use crate::sync::{spin_hint, AtomicBool, AtomicU64, Mutex, Ordering, UnsafeCell};

const IN_LANE: u64 = 1;
const RUNNING: u64 = 2;
const CANCEL_REQ: u64 = 4;
const FINISHING: u64 = 8;
const TERMINAL: u64 = 16;
const DRAINED: u64 = 32;
const FLAGS: u64 = 0xffff_ffff;
const GEN: u64 = !FLAGS;

type Hook = Box<dyn FnOnce() + Send + 'static>;

struct HookCell {
    /// Ticket of the latest registration, so that an old guard cannot remove
    /// a newer hook.
    ticket: u64,
    hook: Option<Hook>,
}

/// The non-generic, shared part of a slot (what a [`CancelToken`] needs).
pub(crate) struct SlotSync {
    state: AtomicU64,
    group: AtomicU64,
    hook: Mutex<HookCell>,
    /// A hook is registered (only read by the running job's own worker, so a
    /// `Relaxed` flag lets the common no-hook path skip the mutex).
    hook_set: AtomicBool,
}

impl SlotSync {
    fn new(state: u64) -> Self {
        Self {
            state: AtomicU64::new(state),
            group: AtomicU64::new(0),
            hook: Mutex::new(HookCell {
                ticket: 0,
                hook: None,
            }),
            hook_set: AtomicBool::new(false),
        }
    }

    fn lock_hook(&self) -> crate::sync::MutexGuard<'_, HookCell> {
        // Hooks run under catch_unwind, so the mutex is never poisoned by
        // them; recover anyway rather than propagate a poison panic.
        self.hook.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the canceller after it set `CANCEL_REQ` for `gen_bits`.
    fn fire_hook(&self, gen_bits: u64) {
        let mut cell = self.lock_hook();
        let cur = self.state.load(Ordering::Acquire);
        if cur & GEN != gen_bits || cur & RUNNING == 0 || cur & FINISHING != 0 {
            return;
        }
        if let Some(hook) = cell.hook.take() {
            self.hook_set.store(false, Ordering::Relaxed);
            // Runs under the mutex: see the module docs.
            let _ = catch_unwind(AssertUnwindSafe(hook));
        }
        drop(cell);
    }

    /// Drops any hook left registered; called by the worker after
    /// `FINISHING`, when `CANCEL_REQ` was seen or a hook is still set.
    fn clear_hook(&self) {
        let taken = {
            let mut cell = self.lock_hook();
            self.hook_set.store(false, Ordering::Relaxed);
            cell.hook.take()
        };
        drop_quietly(taken);
    }
}

struct Slot<J, R> {
    sync: SlotSync,
    /// Payload and deadline: written by the submitter, read by the claiming
    /// worker, dropped by the finisher or by the canceller of a queued job.
    job: UnsafeCell<Option<(J, Option<Instant>)>>,
    /// Written by the publisher of the terminal result, taken by the drainer.
    outcome: UnsafeCell<Option<Outcome<R>>>,
}

/// See the module docs.
pub struct Table<J, R> {
    slots: Box<[CachePadded<Slot<J, R>>]>,
    free: ArrayQueue<u32>,
    lanes: Box<[ArrayQueue<u64>]>,
    done: ArrayQueue<u64>,
}

// SAFETY: the cells inside slots are only accessed by the party that the
// state machine (module docs) makes their owner, with ownership handed over
// through Release/Acquire pairs, so sharing `&Table` between threads is sound
// as long as payloads and outcomes may move between threads (`Send`).
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

/// Cancellation handle given to [`Executor::execute`](crate::Executor::execute)
/// for one attempt of one job.
///
/// * [`is_cancelled`](Self::is_cancelled) — poll the flag (one atomic load).
/// * [`on_cancel`](Self::on_cancel) — register a kill hook (e.g. SIGKILL the
///   sandboxed process) that the pool calls when the job is cancelled while
///   running; keep the returned guard alive while the hook is valid.
///
/// It also tells the executor which job and attempt it is running.
pub struct CancelToken<'a> {
    sync: &'a SlotSync,
    gen: u64,
    id: JobId,
    group: u64,
    attempt: u32,
    deadline: Option<Instant>,
}

impl<'a> CancelToken<'a> {
    /// True once the job has been cancelled. Its outcome will be
    /// [`Outcome::Cancelled`] whatever the executor returns.
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        let cur = self.sync.state.load(Ordering::Acquire);
        cur & GEN == self.gen && cur & CANCEL_REQ != 0
    }

    /// Registers `hook` to be called (once, from the cancelling thread) if the
    /// job is cancelled while the returned guard is alive. If the job is
    /// already cancelled, `hook` runs right now on this thread.
    ///
    /// The hook runs under a per-job mutex that dropping the guard also
    /// takes: once the guard is dropped the hook will never run, and dropping
    /// it waits for a hook that is running. So register the hook after the
    /// resource exists (process spawned) and drop the guard before the
    /// resource goes away (process reaped). The hook must not call back into
    /// this token. Registering again replaces the previous hook. Panics in
    /// the hook are caught and ignored.
    pub fn on_cancel<F>(&self, hook: F) -> KillHookGuard<'a>
    where
        F: FnOnce() + Send + 'static,
    {
        let mut cell = self.sync.lock_hook();
        if self.is_cancelled() {
            drop(cell);
            let _ = catch_unwind(AssertUnwindSafe(hook));
            return KillHookGuard {
                sync: self.sync,
                ticket: 0,
            };
        }
        cell.ticket += 1;
        let ticket = cell.ticket;
        let old = cell.hook.replace(Box::new(hook));
        self.sync.hook_set.store(true, Ordering::Relaxed);
        drop(cell);
        drop_quietly(old);
        KillHookGuard {
            sync: self.sync,
            ticket,
        }
    }

    /// The job's id.
    pub fn job_id(&self) -> JobId {
        self.id
    }

    /// The job's group.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// 0 for the first attempt, `n` for the `n`-th retry after an
    /// [`InfraError`](crate::InfraError).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The job's deadline; the pool does not interrupt a running job when it
    /// passes, so an executor that wants a hard limit enforces it itself.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

impl fmt::Debug for CancelToken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("job_id", &self.id)
            .field("attempt", &self.attempt)
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// Keeps a kill hook registered; see [`CancelToken::on_cancel`].
#[must_use = "dropping the guard unregisters the kill hook at once"]
pub struct KillHookGuard<'a> {
    sync: &'a SlotSync,
    /// 0: nothing registered (the hook already ran).
    ticket: u64,
}

impl Drop for KillHookGuard<'_> {
    fn drop(&mut self) {
        if self.ticket == 0 {
            return;
        }
        let taken = {
            let mut cell = self.sync.lock_hook();
            if cell.ticket == self.ticket {
                self.sync.hook_set.store(false, Ordering::Relaxed);
                cell.hook.take()
            } else {
                None
            }
        };
        drop_quietly(taken);
    }
}

impl fmt::Debug for KillHookGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KillHookGuard").finish_non_exhaustive()
    }
}

/// A stand-alone cancellation source, for driving an executor outside a pool
/// (unit tests of executors, one-off runs).
///
/// ```
/// use agentrl_scheduler::CancelSource;
/// let src = CancelSource::new();
/// let token = src.token();
/// assert!(!token.is_cancelled());
/// assert!(src.cancel());
/// assert!(token.is_cancelled());
/// ```
pub struct CancelSource {
    sync: SlotSync,
}

const SOURCE_GEN: u64 = 1 << 32;

impl CancelSource {
    /// A source whose token is not cancelled.
    pub fn new() -> Self {
        Self {
            sync: SlotSync::new(SOURCE_GEN | RUNNING),
        }
    }

    /// A token (job id 0, group 0, attempt 0, no deadline).
    pub fn token(&self) -> CancelToken<'_> {
        CancelToken {
            sync: &self.sync,
            gen: SOURCE_GEN,
            id: JobId(0),
            group: 0,
            attempt: 0,
            deadline: None,
        }
    }

    /// Cancels: sets the flag and runs the registered hook. Returns false if
    /// already cancelled.
    pub fn cancel(&self) -> bool {
        let prev = self.sync.state.fetch_or(CANCEL_REQ, Ordering::AcqRel);
        if prev & CANCEL_REQ != 0 {
            return false;
        }
        self.sync.fire_hook(SOURCE_GEN);
        true
    }
}

impl Default for CancelSource {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CancelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelSource")
            .field("cancelled", &self.token().is_cancelled())
            .finish()
    }
}

/// Pushes into a queue that is known to have room (see the module docs),
/// retrying across the transient "full" of a pre-empted consumer.
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
