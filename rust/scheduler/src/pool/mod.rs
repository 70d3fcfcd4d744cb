//! The worker pool: submission with backpressure, workers, retries, panics,
//! cancellation, completion through an eventfd, statistics and shutdown.
//!
//! Layout: this file holds [`Executor`], [`Config`], the shared state and
//! [`Pool`]'s constructor; `submit` (submission, backpressure, refusals),
//! `cancel` (cancellation), `completion` (results and the eventfd), `stats`
//! ([`Stats`] and the per-worker counters), `worker` (the worker loop,
//! retries, panics) and `shutdown` (`close` and `Drop`). The design is in the
//! crate docs.

mod cancel;
mod completion;
mod shutdown;
mod stats;
mod submit;
mod worker;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::eventfd::EventFd;
use crate::job::{InfraError, PRIORITY_LANES};
use crate::pad::CachePadded;
use crate::table::{CancelToken, Table};
use crate::wait::WaitQueue;

pub use self::stats::Stats;
use self::stats::WorkerCounters;
pub use self::submit::{BatchError, RejectReason, SubmitError};
use self::worker::worker_main;

/// Runs jobs. One instance is shared by all workers (`&self`).
pub trait Executor: Send + Sync + 'static {
    /// The job payload.
    type Job: Send + 'static;
    /// The job's result. A program's own failure (non-zero exit, failed
    /// test...) belongs in here: it is a result, never retried.
    type Output: Send + 'static;

    /// Runs one attempt of `job`. Return `Err(InfraError)` for failures of the
    /// infrastructure (retried up to [`Config::retries`] times); a panic ends
    /// the job as [`Outcome::Failed`] and is not retried. `cancel` tells
    /// whether the job has been cancelled and takes a kill hook.
    ///
    /// [`Outcome::Failed`]: crate::Outcome::Failed
    fn execute(
        &self,
        job: &Self::Job,
        cancel: &CancelToken<'_>,
    ) -> Result<Self::Output, InfraError>;
}

/// What `submit` does when all `capacity` job slots are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backpressure {
    /// Wait up to this long (per `submit` / `submit_many` call) for a slot,
    /// then fail with [`RejectReason::Full`]. Slots are freed by draining
    /// results, so a thread that is also the only consumer should not block
    /// for long (an asyncio loop should use [`Backpressure::Error`]).
    Block(Duration),
    /// Fail at once with [`RejectReason::Full`].
    Error,
}

/// Pool configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Worker threads; 0 means one per available core.
    pub workers: usize,
    /// Job slots: the most jobs that can be in the pool at once, counting
    /// queued, running and finished-but-not-yet-drained jobs. (A job
    /// cancelled while queued keeps its slot until a worker skips its queue
    /// entry.) 1 ..= `u32::MAX`.
    pub capacity: usize,
    /// Extra attempts after an [`InfraError`] (total attempts = 1 + retries).
    pub retries: u32,
    /// Behaviour when full.
    pub backpressure: Backpressure,
    /// Prefix of the worker threads' names.
    pub thread_name: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 0,
            capacity: 16_384,
            retries: 2,
            backpressure: Backpressure::Error,
            thread_name: "agentrl-worker".to_owned(),
        }
    }
}

struct Shared<E: Executor> {
    table: Table<E::Job, E::Output>,
    executor: E,
    retries: u32,
    backpressure: Backpressure,
    /// Set by `close`: no new submissions.
    closed: AtomicBool,
    /// Set by `close` once no submission is in flight: workers exit when the
    /// lanes are empty.
    shutdown: AtomicBool,
    /// Set by `close(false)`: workers cancel what they pop instead of running.
    cancel_all: AtomicBool,
    /// Submissions in progress (so `close` can wait for them to land).
    submitters: CachePadded<AtomicUsize>,
    submitted: CachePadded<AtomicU64>,
    /// Results published outside workers (cancelled while queued).
    cancelled_outside: AtomicU64,
    idle: WaitQueue,
    space: WaitQueue,
    /// Completion fd armed: a result was pushed since the consumer last
    /// reset this flag, and the eventfd was (or is about to be) written.
    signalled: CachePadded<AtomicBool>,
    /// The eventfd was written and not read since.
    efd_dirty: CachePadded<AtomicBool>,
    efd: EventFd,
    counters: Box<[CachePadded<WorkerCounters>]>,
    alive: AtomicUsize,
    start: Instant,
}

/// A fixed-size pool of worker threads running jobs of one [`Executor`].
///
/// `Pool` is `Send + Sync`: share it (e.g. in an `Arc`) between submitting
/// threads and the consumer. See the [crate docs](crate) for the design.
pub struct Pool<E: Executor> {
    shared: Arc<Shared<E>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    workers: usize,
    /// The process that made the pool. In a child made with `fork()` (a copy of the pool
    /// without its worker threads) it refuses jobs, and closing or dropping it stops nothing.
    owner_pid: u32,
}

impl<E: Executor> fmt::Debug for Pool<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("workers", &self.workers)
            .field("capacity", &self.shared.table.capacity())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl<E: Executor> Pool<E> {
    /// Starts `config.workers` worker threads. Fails if the capacity is out
    /// of range, or if the eventfd or a thread cannot be created.
    pub fn new(executor: E, config: Config) -> io::Result<Self> {
        if config.capacity == 0 || config.capacity > u32::MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "capacity must be in 1..=u32::MAX",
            ));
        }
        let workers = if config.workers == 0 {
            thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            config.workers
        };
        let shared = Arc::new(Shared {
            table: Table::new(config.capacity, PRIORITY_LANES),
            executor,
            retries: config.retries,
            backpressure: config.backpressure,
            closed: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            cancel_all: AtomicBool::new(false),
            submitters: CachePadded::new(AtomicUsize::new(0)),
            submitted: CachePadded::new(AtomicU64::new(0)),
            cancelled_outside: AtomicU64::new(0),
            idle: WaitQueue::default(),
            space: WaitQueue::default(),
            signalled: CachePadded::new(AtomicBool::new(false)),
            efd_dirty: CachePadded::new(AtomicBool::new(false)),
            efd: EventFd::new()?,
            counters: (0..workers).map(|_| CachePadded::default()).collect(),
            alive: AtomicUsize::new(0),
            start: Instant::now(),
        });
        let pool = Pool {
            shared,
            handles: Mutex::new(Vec::with_capacity(workers)),
            workers,
            owner_pid: std::process::id(),
        };
        for w in 0..workers {
            let shared = pool.shared.clone();
            // Counted before the thread runs so that `workers_alive` is
            // exact as soon as `new` returns; the thread decrements on exit.
            pool.shared.alive.fetch_add(1, Ordering::SeqCst);
            let handle = thread::Builder::new()
                .name(format!("{}-{w}", config.thread_name))
                .spawn(move || worker_main(&shared, w));
            match handle {
                Ok(h) => pool.lock_handles().push(h),
                Err(e) => {
                    pool.shared.alive.fetch_sub(1, Ordering::SeqCst);
                    pool.close(false);
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    fn lock_handles(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.shared.executor
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Number of job slots.
    pub fn capacity(&self) -> usize {
        self.shared.table.capacity()
    }

    /// True after [`close`](Self::close) started.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Whether this is a copy inherited through `fork()` (see `owner_pid`).
    fn forked(&self) -> bool {
        std::process::id() != self.owner_pid
    }
}
