//! Cancellation handles and kill hooks: the per-slot [`SlotSync`] (state
//! word, group, kill-hook mutex) and what executors hold, [`CancelToken`],
//! [`KillHookGuard`] and the stand-alone [`CancelSource`]. How hooks are
//! fired and unregistered is in `docs/design/scheduler.md`, "Kill hooks".

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::job::JobId;
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

use super::{drop_quietly, CANCEL_REQ, FINISHING, GEN, RUNNING};

type Hook = Box<dyn FnOnce() + Send + 'static>;

struct HookCell {
    /// Ticket of the latest registration, so that an old guard cannot remove
    /// a newer hook.
    ticket: u64,
    hook: Option<Hook>,
}

/// The non-generic, shared part of a slot (what a [`CancelToken`] needs).
pub(crate) struct SlotSync {
    pub(super) state: AtomicU64,
    pub(super) group: AtomicU64,
    hook: Mutex<HookCell>,
    /// A hook is registered (only read by the running job's own worker, so a
    /// `Relaxed` flag lets the common no-hook path skip the mutex).
    pub(super) hook_set: AtomicBool,
}

impl SlotSync {
    pub(super) fn new(state: u64) -> Self {
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
    pub(super) fn fire_hook(&self, gen_bits: u64) {
        let mut cell = self.lock_hook();
        let cur = self.state.load(Ordering::Acquire);
        if cur & GEN != gen_bits || cur & RUNNING == 0 || cur & FINISHING != 0 {
            return;
        }
        if let Some(hook) = cell.hook.take() {
            self.hook_set.store(false, Ordering::Relaxed);
            // Runs under the mutex: see docs/design/scheduler.md, "Kill hooks".
            let _ = catch_unwind(AssertUnwindSafe(hook));
        }
        drop(cell);
    }

    /// Drops any hook left registered; called by the worker after
    /// `FINISHING`, when `CANCEL_REQ` was seen or a hook is still set.
    pub(super) fn clear_hook(&self) {
        let taken = {
            let mut cell = self.lock_hook();
            self.hook_set.store(false, Ordering::Relaxed);
            cell.hook.take()
        };
        drop_quietly(taken);
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
    pub(super) sync: &'a SlotSync,
    pub(super) gen: u64,
    pub(super) id: JobId,
    pub(super) group: u64,
    pub(super) attempt: u32,
    pub(super) deadline: Option<Instant>,
}

impl<'a> CancelToken<'a> {
    /// True once the job has been cancelled. Its outcome will be
    /// [`Outcome::Cancelled`] whatever the executor returns.
    ///
    /// [`Outcome::Cancelled`]: crate::Outcome::Cancelled
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
