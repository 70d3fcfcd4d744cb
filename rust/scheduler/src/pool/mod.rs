//! The worker pool: submission with backpressure, workers, retries, panics,
//! cancellation, completion through an eventfd, statistics and shutdown.

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::eventfd::EventFd;
use crate::job::{lane_of, InfraError, JobId, JobSpec, Outcome, OutcomeKind, PRIORITY_LANES};
use crate::pad::CachePadded;
use crate::table::{drop_quietly, Cancel, CancelToken, Claimed, Next, Table};
use crate::wait::WaitQueue;

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

/// Why a submission was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// No free slot (immediately with [`Backpressure::Error`], after the
    /// timeout with [`Backpressure::Block`]).
    Full,
    /// The pool is closed.
    Closed,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RejectReason::Full => "scheduler queue is full",
            RejectReason::Closed => "scheduler is closed",
        })
    }
}

/// A refused [`Pool::submit`]; gives the job back.
pub struct SubmitError<J> {
    /// Why.
    pub reason: RejectReason,
    /// The job, untouched.
    pub spec: JobSpec<J>,
}

impl<J> fmt::Debug for SubmitError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl<J> fmt::Display for SubmitError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.reason, f)
    }
}

impl<J> std::error::Error for SubmitError<J> {}

/// A [`Pool::submit_many`] that could not take every job. The jobs before the
/// first refused one were accepted (in order); the rest are given back.
pub struct BatchError<J> {
    /// Why the first rejected job was refused.
    pub reason: RejectReason,
    /// Ids of the accepted jobs, in input order (a prefix of the batch).
    pub accepted: Vec<JobId>,
    /// The refused jobs, in input order (the rest of the batch).
    pub rejected: Vec<JobSpec<J>>,
}

impl<J> fmt::Debug for BatchError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchError")
            .field("reason", &self.reason)
            .field("accepted", &self.accepted.len())
            .field("rejected", &self.rejected.len())
            .finish()
    }
}

impl<J> fmt::Display for BatchError<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} jobs accepted, {} rejected)",
            self.reason,
            self.accepted.len(),
            self.rejected.len()
        )
    }
}

impl<J> std::error::Error for BatchError<J> {}

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
struct WorkerCounters {
    completed: AtomicU64,
    cancelled: AtomicU64,
    expired: AtomicU64,
    failed: AtomicU64,
    panics: AtomicU64,
    retries: AtomicU64,
    running: AtomicU64,
    busy_ns: AtomicU64,
    /// 1 + start of the current busy period in ns since pool start; 0 = idle.
    busy_since: AtomicU64,
}

#[inline]
fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl WorkerCounters {
    fn count(&self, kind: OutcomeKind) {
        bump(match kind {
            OutcomeKind::Completed => &self.completed,
            OutcomeKind::Cancelled => &self.cancelled,
            OutcomeKind::Expired => &self.expired,
            OutcomeKind::Failed => &self.failed,
        });
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

/// Registers an in-flight submission (see `Shared::submitters`).
struct SubmitGuard<'a>(&'a AtomicUsize);

impl Drop for SubmitGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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

    fn enter(&self) -> Option<SubmitGuard<'_>> {
        if self.forked() {
            return None; // no worker here would ever run it: refused as closed
        }
        let s = &self.shared;
        // SeqCst pair with `close`: either close sees our increment and waits
        // for us, or we see `closed` and back out.
        s.submitters.fetch_add(1, Ordering::SeqCst);
        let guard = SubmitGuard(&s.submitters);
        if s.closed.load(Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// Waits for a free slot under [`Backpressure::Block`]; `Err` says why to
    /// give up.
    fn wait_for_space(
        &self,
        deadline: &mut Option<Instant>,
        timeout: Duration,
    ) -> Result<(), RejectReason> {
        let s = &self.shared;
        let d = *deadline.get_or_insert_with(|| Instant::now() + timeout);
        // Workers may be asleep with our earlier jobs queued: make sure they
        // run, or nothing will free a slot.
        s.idle.notify_all();
        s.space.wait_until(
            || s.table.has_free() || s.closed.load(Ordering::SeqCst),
            Some(d),
        );
        if s.closed.load(Ordering::SeqCst) {
            Err(RejectReason::Closed)
        } else if Instant::now() >= d && !s.table.has_free() {
            Err(RejectReason::Full)
        } else {
            Ok(())
        }
    }

    /// Submits one job. Returns its id, or gives the job back if the pool is
    /// closed or full (after waiting, with [`Backpressure::Block`]).
    pub fn submit(&self, spec: JobSpec<E::Job>) -> Result<JobId, SubmitError<E::Job>> {
        let Some(_guard) = self.enter() else {
            return Err(SubmitError {
                reason: RejectReason::Closed,
                spec,
            });
        };
        let s = &self.shared;
        let mut spec = spec;
        let mut deadline = None;
        loop {
            let lane = lane_of(spec.priority);
            match s.table.try_submit(spec, lane) {
                Ok(id) => {
                    s.submitted.fetch_add(1, Ordering::Relaxed);
                    s.idle.notify_one();
                    return Ok(id);
                }
                Err(back) => {
                    spec = back;
                    let timeout = match s.backpressure {
                        Backpressure::Error => {
                            return Err(SubmitError {
                                reason: RejectReason::Full,
                                spec,
                            })
                        }
                        Backpressure::Block(t) => t,
                    };
                    if let Err(reason) = self.wait_for_space(&mut deadline, timeout) {
                        return Err(SubmitError { reason, spec });
                    }
                }
            }
        }
    }

    /// Submits a batch in one call: one registration, one wake-up per 256
    /// jobs instead of one per job. Jobs are accepted in order; if one is
    /// refused (full after the backpressure policy, or closed), it and all
    /// later ones are given back in the error together with the ids of the
    /// accepted prefix.
    pub fn submit_many(
        &self,
        specs: Vec<JobSpec<E::Job>>,
    ) -> Result<Vec<JobId>, BatchError<E::Job>> {
        let Some(_guard) = self.enter() else {
            return Err(BatchError {
                reason: RejectReason::Closed,
                accepted: Vec::new(),
                rejected: specs,
            });
        };
        let s = &self.shared;
        let mut ids = Vec::with_capacity(specs.len());
        let mut deadline = None;
        let mut rest = specs.into_iter();
        let mut failure = None;
        'jobs: for spec in rest.by_ref() {
            let mut spec = spec;
            loop {
                let lane = lane_of(spec.priority);
                match s.table.try_submit(spec, lane) {
                    Ok(id) => {
                        ids.push(id);
                        if ids.len() % 256 == 1 {
                            s.idle.notify_all();
                        }
                        break;
                    }
                    Err(back) => {
                        spec = back;
                        let waited = match s.backpressure {
                            Backpressure::Error => Err(RejectReason::Full),
                            Backpressure::Block(t) => self.wait_for_space(&mut deadline, t),
                        };
                        if let Err(reason) = waited {
                            failure = Some((reason, spec));
                            break 'jobs;
                        }
                    }
                }
            }
        }
        s.submitted.fetch_add(ids.len() as u64, Ordering::Relaxed);
        s.idle.notify_all();
        match failure {
            None => Ok(ids),
            Some((reason, spec)) => {
                let mut rejected = Vec::with_capacity(rest.len() + 1);
                rejected.push(spec);
                rejected.extend(rest);
                Err(BatchError {
                    reason,
                    accepted: ids,
                    rejected,
                })
            }
        }
    }

    /// Cancels a job. A queued job never starts and its `Cancelled` result is
    /// published at once; a running job's kill hook is called and it reports
    /// `Cancelled` when its executor returns. Returns true iff this call
    /// cancelled the job (i.e. its outcome will be [`Outcome::Cancelled`]);
    /// false for unknown ids, finished or finishing jobs, and jobs already
    /// cancelled.
    pub fn cancel(&self, id: JobId) -> bool {
        match self.shared.table.cancel(id) {
            Cancel::Queued => {
                self.shared
                    .cancelled_outside
                    .fetch_add(1, Ordering::Relaxed);
                self.shared.signal_completion();
                true
            }
            Cancel::Running => true,
            Cancel::No => false,
        }
    }

    /// Cancels every queued or running job of `group` (as [`cancel`]).
    /// Returns how many jobs this call cancelled. Scans all slots twice
    /// (queued jobs first, then running ones): O(capacity), a few
    /// microseconds per thousand slots. A queued job of the group that a
    /// worker starts during the scan is cancelled while running unless it
    /// has already finished; jobs submitted to the group concurrently with
    /// this call may escape it.
    ///
    /// [`cancel`]: Self::cancel
    pub fn cancel_group(&self, group: u64) -> usize {
        self.shared.cancel_where(|g| g == group)
    }

    /// The completion eventfd: readable when results are pending. Watch it
    /// (e.g. `loop.add_reader(fd, ...)`) and call [`drain`](Self::drain) when
    /// it fires; never read it yourself. It may occasionally be readable with
    /// nothing to drain. Valid as long as the pool lives.
    pub fn completion_fd(&self) -> RawFd {
        self.shared.efd.raw()
    }

    /// Takes up to `max` results without blocking.
    pub fn drain(&self, max: usize) -> Vec<(JobId, Outcome<E::Output>)> {
        let mut out = Vec::with_capacity(max.min(self.shared.table.done_len().max(1)));
        self.drain_into(&mut out, max);
        out
    }

    /// [`drain`](Self::drain) into an existing vector (appends); returns how
    /// many results were taken.
    pub fn drain_into(&self, out: &mut Vec<(JobId, Outcome<E::Output>)>, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        let s = &self.shared;
        // Disarm first, then look: a result pushed after our pops missed it
        // will find `signalled == false` and write the eventfd (see the
        // crate docs, "Completion wake-ups").
        if s.efd_dirty.swap(false, Ordering::SeqCst) {
            s.efd.clear();
        }
        s.signalled.swap(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut n = 0;
        while n < max {
            match s.table.pop_done() {
                Some(result) => {
                    out.push(result);
                    n += 1;
                }
                None => break,
            }
        }
        if n == max && s.table.has_done() {
            // Left some behind: keep the fd readable.
            s.arm();
        }
        if n > 0 {
            s.space.notify_all();
        }
        n
    }

    /// Blocks until a result is available or `timeout` passes. For
    /// synchronous users; uses the same eventfd as `completion_fd`.
    pub fn wait_result(&self, timeout: Duration) -> Option<(JobId, Outcome<E::Output>)> {
        let deadline = Instant::now().checked_add(timeout);
        let mut out = Vec::with_capacity(1);
        loop {
            if self.drain_into(&mut out, 1) == 1 {
                return out.pop();
            }
            let remaining = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    Some(d - now)
                }
                None => None,
            };
            self.shared.efd.wait_readable(remaining);
        }
    }

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

    /// Stops the pool; loses nothing. New submissions fail with
    /// [`RejectReason::Closed`] from the moment `close` starts.
    ///
    /// * `drain == true`: every job already accepted still runs (or expires)
    ///   and reports its outcome;
    /// * `drain == false`: queued jobs are reported `Cancelled` at once and
    ///   running ones are cancelled through their kill hooks.
    ///
    /// Returns when all workers have exited; the results stay available to
    /// [`drain`](Self::drain) / [`wait_result`](Self::wait_result).
    /// Idempotent; a `close(false)` issued while a `close(true)` is waiting
    /// escalates it. Called from inside an executor it does not wait for the
    /// calling worker. Dropping the pool runs `close(false)`.
    pub fn close(&self, drain: bool) {
        if self.forked() {
            // The workers (and what they run) are the parent's.
            return;
        }
        let s = &self.shared;
        s.closed.store(true, Ordering::SeqCst);
        if !drain {
            s.cancel_all.store(true, Ordering::SeqCst);
        }
        // Submitters blocked on a full pool give up (`closed`).
        s.space.notify_all();
        while s.submitters.load(Ordering::SeqCst) != 0 {
            thread::yield_now();
        }
        // Every accepted job is now in a lane, running, or finished.
        if !drain {
            s.cancel_where(|_| true);
        }
        s.shutdown.store(true, Ordering::SeqCst);
        s.idle.notify_all();
        let me = thread::current().id();
        let mut handles = self.lock_handles();
        for h in handles.drain(..) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

impl<E: Executor> Drop for Pool<E> {
    fn drop(&mut self) {
        if self.forked() {
            // Dropping the executor and the jobs here would tear down the parent's resources
            // (sandboxes, their cgroups): this copy's share is leaked instead.
            std::mem::forget(Arc::clone(&self.shared));
            // (No locking: a lock copied by fork may be held by a thread that is not here.)
            std::mem::forget(std::mem::take(
                self.handles.get_mut().unwrap_or_else(|e| e.into_inner()),
            ));
            return;
        }
        self.close(false);
    }
}

impl<E: Executor> Shared<E> {
    fn cancel_where(&self, pred: impl FnMut(u64) -> bool) -> usize {
        let (queued, running) = self.table.cancel_where(pred);
        if queued > 0 {
            self.cancelled_outside
                .fetch_add(queued as u64, Ordering::Relaxed);
            self.signal_completion();
        }
        queued + running
    }

    /// Makes the completion fd readable unless it already is (or is about
    /// to be).
    #[inline]
    fn arm(&self) {
        if !self.signalled.swap(true, Ordering::SeqCst) {
            self.efd.notify();
            self.efd_dirty.store(true, Ordering::SeqCst);
        }
    }

    /// Called after pushing a result.
    #[inline]
    fn signal_completion(&self) {
        // Pairs with the consumer's `swap(false)` + fence in `drain_into`.
        fence(Ordering::SeqCst);
        if !self.signalled.load(Ordering::Relaxed) {
            self.arm();
        }
    }

    fn run(&self, job: Claimed<'_, E::Job, E::Output>, c: &WorkerCounters) {
        let outcome = if self.cancel_all.load(Ordering::Relaxed) {
            Outcome::Cancelled
        } else if job.deadline().is_some_and(|d| Instant::now() >= d) {
            Outcome::Expired
        } else {
            c.running.store(1, Ordering::Relaxed);
            let outcome = self.attempts(&job, c);
            c.running.store(0, Ordering::Relaxed);
            outcome
        };
        let kind = job.finish(outcome);
        c.count(kind);
        self.signal_completion();
    }

    fn attempts(
        &self,
        job: &Claimed<'_, E::Job, E::Output>,
        c: &WorkerCounters,
    ) -> Outcome<E::Output> {
        let mut attempt = 0u32;
        loop {
            if job.cancel_requested() {
                return Outcome::Cancelled;
            }
            let token = job.token(attempt);
            let result = catch_unwind(AssertUnwindSafe(|| {
                self.executor.execute(job.payload(), &token)
            }));
            match result {
                Ok(Ok(output)) => return Outcome::Completed(output),
                Ok(Err(e)) => {
                    if attempt >= self.retries {
                        return Outcome::Failed(format!(
                            "infrastructure error after {} attempt(s): {}",
                            attempt + 1,
                            e.reason
                        ));
                    }
                    if job.deadline().is_some_and(|d| Instant::now() >= d) {
                        return Outcome::Expired;
                    }
                    attempt += 1;
                    bump(&c.retries);
                }
                Err(payload) => {
                    bump(&c.panics);
                    let msg = panic_message(payload.as_ref());
                    drop_quietly(payload);
                    return Outcome::Failed(format!("executor panicked: {msg}"));
                }
            }
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Spins briefly for new work before parking (cheap when jobs arrive in a
/// steady stream; bounded so idle workers leave the CPU to others).
fn spin_for_work<E: Executor>(s: &Shared<E>) -> bool {
    for i in 0..48 {
        if s.table.has_queued() {
            return true;
        }
        if i < 40 {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
    false
}

fn worker_main<E: Executor>(s: &Shared<E>, w: usize) {
    // The executor's panics are caught per attempt; this outer guard keeps
    // the thread (and so the pool size) even if a panic escapes elsewhere
    // (e.g. from a payload's Drop). The job involved still gets a result:
    // `Claimed`'s Drop publishes `Failed`.
    while catch_unwind(AssertUnwindSafe(|| worker_loop(s, w))).is_err() {}
    let c = &s.counters[w];
    c.running.store(0, Ordering::Relaxed);
    s.alive.fetch_sub(1, Ordering::SeqCst);
}

fn worker_loop<E: Executor>(s: &Shared<E>, w: usize) {
    let c = &s.counters[w];
    let mut busy_since: Option<Instant> = None;
    loop {
        // Read before popping: if shutdown is set, every accepted job is
        // already in a lane, so an empty pass means we are done.
        let stopping = s.shutdown.load(Ordering::SeqCst);
        match s.table.next() {
            Next::Job(job) => {
                if busy_since.is_none() {
                    let now = Instant::now();
                    busy_since = Some(now);
                    let ns = now.duration_since(s.start).as_nanos() as u64;
                    c.busy_since.store(ns + 1, Ordering::Relaxed);
                }
                s.run(job, c);
            }
            Next::Skipped => s.space.notify_all(),
            Next::Empty => {
                if let Some(since) = busy_since.take() {
                    let busy = since.elapsed().as_nanos() as u64;
                    c.busy_ns
                        .store(c.busy_ns.load(Ordering::Relaxed) + busy, Ordering::Relaxed);
                    c.busy_since.store(0, Ordering::Relaxed);
                }
                if stopping {
                    return;
                }
                if !spin_for_work(s) {
                    s.idle.wait_until(
                        || s.table.has_queued() || s.shutdown.load(Ordering::SeqCst),
                        None,
                    );
                }
            }
        }
    }
}
