//! Statistics: [`Stats`], the per-worker counters and [`Pool::stats`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::job::{OutcomeKind, PRIORITY_LANES};

use super::{Executor, Pool};

/// A snapshot of the pool's counters ([`Pool::stats`]). Counters are read
/// one by one without a global lock, so a snapshot taken while jobs move may
/// be off by the few jobs in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Configured worker threads.
    pub workers: usize,
    /// Worker threads currently alive (equals `workers` until `close`).
    pub workers_alive: usize,
    /// Job slots.
    pub capacity: usize,
    /// Entries per priority lane; index `i` is priority
    /// `MIN_PRIORITY + i` (see [`lane_priority`](crate::lane_priority)).
    /// Includes entries of jobs cancelled while queued not yet skipped.
    pub queue_depth: [usize; PRIORITY_LANES],
    /// Jobs executing right now.
    pub running: usize,
    /// Finished jobs whose result has not been drained yet.
    pub pending_results: usize,
    /// Jobs accepted so far.
    pub submitted: u64,
    /// Terminal results published so far, by kind.
    pub completed: u64,
    /// See `completed`.
    pub cancelled: u64,
    /// See `completed`.
    pub expired: u64,
    /// See `completed` (includes panics and exhausted retries).
    pub failed: u64,
    /// Executor panics caught.
    pub panics: u64,
    /// Infrastructure retries performed.
    pub retries: u64,
    /// Sum of worker busy time / (workers × wall time since start), in 0..=1.
    /// A worker is busy from the moment it finds a job until it finds the
    /// queues empty.
    pub utilisation: f64,
    /// Terminal results per second since the pool started.
    pub jobs_per_sec: f64,
    /// Time since the pool started.
    pub elapsed: Duration,
}

impl Stats {
    /// Sum of `queue_depth`.
    pub fn queued(&self) -> usize {
        self.queue_depth.iter().sum()
    }

    /// `completed + cancelled + expired + failed`.
    pub fn finished(&self) -> u64 {
        self.completed + self.cancelled + self.expired + self.failed
    }
}

/// Per-worker counters, each written by its worker only (plain load + store,
/// no read-modify-write) and read by `stats()`.
#[derive(Default)]
pub(super) struct WorkerCounters {
    completed: AtomicU64,
    cancelled: AtomicU64,
    expired: AtomicU64,
    failed: AtomicU64,
    pub(super) panics: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) running: AtomicU64,
    pub(super) busy_ns: AtomicU64,
    /// 1 + start of the current busy period in ns since pool start; 0 = idle.
    pub(super) busy_since: AtomicU64,
}

#[inline]
pub(super) fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl WorkerCounters {
    pub(super) fn count(&self, kind: OutcomeKind) {
        bump(match kind {
            OutcomeKind::Completed => &self.completed,
            OutcomeKind::Cancelled => &self.cancelled,
            OutcomeKind::Expired => &self.expired,
            OutcomeKind::Failed => &self.failed,
        });
    }
}

impl<E: Executor> Pool<E> {
    /// A snapshot of queue depths, running jobs, outcome counters and
    /// throughput.
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        let now = Instant::now();
        let elapsed = now.duration_since(s.start);
        let now_ns = elapsed.as_nanos() as u64;
        let mut st = Stats {
            workers: self.workers,
            workers_alive: s.alive.load(Ordering::SeqCst),
            capacity: s.table.capacity(),
            queue_depth: [0; PRIORITY_LANES],
            running: 0,
            pending_results: s.table.done_len(),
            submitted: s.submitted.load(Ordering::Relaxed),
            completed: 0,
            cancelled: s.cancelled_outside.load(Ordering::Relaxed),
            expired: 0,
            failed: 0,
            panics: 0,
            retries: 0,
            utilisation: 0.0,
            jobs_per_sec: 0.0,
            elapsed,
        };
        for (d, l) in st.queue_depth.iter_mut().zip(s.table.lane_depths()) {
            *d = l;
        }
        let mut busy_ns: u64 = 0;
        for c in s.counters.iter() {
            st.running += c.running.load(Ordering::Relaxed) as usize;
            st.completed += c.completed.load(Ordering::Relaxed);
            st.cancelled += c.cancelled.load(Ordering::Relaxed);
            st.expired += c.expired.load(Ordering::Relaxed);
            st.failed += c.failed.load(Ordering::Relaxed);
            st.panics += c.panics.load(Ordering::Relaxed);
            st.retries += c.retries.load(Ordering::Relaxed);
            busy_ns += c.busy_ns.load(Ordering::Relaxed);
            let since = c.busy_since.load(Ordering::Relaxed);
            if since != 0 {
                busy_ns += now_ns.saturating_sub(since - 1);
            }
        }
        let secs = elapsed.as_secs_f64();
        if secs > 0.0 {
            st.utilisation = (busy_ns as f64 / 1e9 / (secs * self.workers as f64)).min(1.0);
            st.jobs_per_sec = st.finished() as f64 / secs;
        }
        st
    }
}
