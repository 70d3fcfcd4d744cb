//! Lock-free job scheduler core for agentrl (issue 4): bounded MPMC queues, a
//! worker pool with priorities, cancellation, deadlines, retries and
//! completion notification through an eventfd. It knows nothing about Python
//! or sandboxes: jobs are any `Send` payload run by an [`Executor`].
//!
//! # Usage
//!
//! ```
//! use std::time::Duration;
//! use agentrl_scheduler::{CancelToken, Config, Executor, InfraError, JobSpec, Outcome, Pool};
//!
//! struct Square;
//! impl Executor for Square {
//!     type Job = u64;
//!     type Output = u64;
//!     fn execute(&self, job: &u64, _cancel: &CancelToken<'_>) -> Result<u64, InfraError> {
//!         Ok(job * job)
//!     }
//! }
//!
//! let pool = Pool::new(Square, Config { workers: 2, ..Config::default() }).unwrap();
//! let id = pool.submit(JobSpec::new(7).priority(1).group(42)).unwrap();
//! let (done, outcome) = pool.wait_result(Duration::from_secs(5)).unwrap();
//! assert_eq!((done, outcome), (id, Outcome::Completed(49)));
//! pool.close(true);
//! ```
//!
//! # API
//!
//! * [`Pool::new`]`(executor, `[`Config`]`)` — `workers` (0 = one per core),
//!   `capacity` (job slots), `retries` (infrastructure retries),
//!   `backpressure` ([`Backpressure::Block`]`(timeout)` or
//!   [`Backpressure::Error`]).
//! * [`Pool::submit`]`(`[`JobSpec`]`) -> Result<`[`JobId`]`, `[`SubmitError`]`>`
//!   and [`Pool::submit_many`]`(Vec<JobSpec>)`; a refused job is handed back.
//! * [`Pool::cancel`]`(id) -> bool`, [`Pool::cancel_group`]`(group) -> usize`.
//! * [`Pool::completion_fd`], [`Pool::drain`]`(max)`, [`Pool::drain_into`],
//!   [`Pool::wait_result`]`(timeout)`.
//! * [`Pool::stats`] → [`Stats`]; [`Pool::close`]`(drain)`.
//! * [`Executor::execute`]`(&job, &`[`CancelToken`]`) -> Result<Output, `[`InfraError`]`>`;
//!   [`CancelToken::is_cancelled`], [`CancelToken::on_cancel`] (kill hook).
//! * Every job ends with exactly one [`Outcome`]: `Completed(R)`, `Cancelled`,
//!   `Expired` or `Failed(String)`.
//! * [`queue::bounded`] — the MPMC queue itself, with [`queue::Producer`] /
//!   [`queue::Consumer`] handles.
//!
//! # Design
//!
//! ## Queues
//!
//! Every queue is the bounded MPMC array queue of Dmitry Vyukov (per-cell
//! sequence numbers; head and tail each in their own 128-byte
//! [`CachePadded`] line); see [`queue`] for the algorithm and its memory
//! orderings. The pool uses it for
//!
//! * the free list of job slots (admission control: no free slot = full),
//! * one lane per priority: [`PRIORITY_LANES`] lanes for priorities
//!   [`MIN_PRIORITY`]`..=`[`MAX_PRIORITY`]; other `i32` priorities are clamped
//!   into that range ([`lane_of`]). Workers serve the highest non-empty lane
//!   first and each lane is FIFO, so jobs of one priority start in submission
//!   order (strict priority: a steady stream of high-priority work starves
//!   lower lanes),
//! * the completion queue of finished job ids.
//!
//! Queues carry 8-byte ids; payloads and outcomes stay in the job's slot.
//!
//! ## Job slots and exactly-once results
//!
//! A job lives in one of `capacity` slots, whose atomic state word
//! (generation + flags) is the single point of truth; see
//! `docs/design/scheduler.md` for the state machine. In short: a queued job
//! is either claimed by a worker or cancelled, by a CAS on the same word; a
//! running job accepts a cancellation only until the worker's `fetch_or` that
//! marks it finishing, which also tells the worker whether it was cancelled.
//! Ids embed the slot generation so operations on stale ids fail.
//!
//! ## Execution, retries, panics, deadlines
//!
//! A worker claims a job, checks its deadline (passed → `Expired`, not run),
//! and calls [`Executor::execute`] inside `catch_unwind`. `Err(InfraError)`
//! is retried immediately on the same worker, up to [`Config::retries`]
//! times, unless the job was cancelled or its deadline has passed
//! (`Expired`); when retries run out the outcome is `Failed("infrastructure
//! error after N attempt(s): <reason>")`. A panic gives
//! `Failed("executor panicked: <message>")` and is not retried; the worker
//! thread survives, so the pool keeps its size. A deadline never interrupts a
//! running attempt (no timer thread); executors that need a hard limit read
//! [`CancelToken::deadline`].
//!
//! ## Cancellation
//!
//! Cancelling a queued job publishes `Cancelled` immediately from the
//! cancelling thread; the job never starts. Cancelling a running job sets
//! the token's flag and calls the kill hook the executor registered with
//! [`CancelToken::on_cancel`] (under a per-job mutex, so the hook never runs
//! after its guard is dropped); the worker then reports `Cancelled` whatever
//! `execute` returns. `cancel` returns true exactly when the job's outcome will
//! be `Cancelled`.
//!
//! ## Idle workers (no busy loop)
//!
//! A worker that finds every lane empty spins 40 iterations, yields 8 times,
//! then parks on a condvar. Submitters wake it through a waiter count:
//! `push; fence(SeqCst); if waiters > 0 { lock; notify }` against the
//! worker's `lock; waiters += 1; fence(SeqCst); re-check lanes; wait`. Either
//! the worker's re-check sees the job or the submitter sees the waiter and
//! notifies under the lock, so no wake-up is lost; with busy workers the
//! submitter pays one fence and one load. The same scheme parks submitters
//! blocked by [`Backpressure::Block`] until a slot is freed.
//!
//! ## Completion wake-ups
//!
//! Results go to the completion queue, and an `eventfd` (`EFD_NONBLOCK |
//! EFD_CLOEXEC`, [`Pool::completion_fd`]) is readable while results are
//! pending, so an asyncio loop can `add_reader` it. To avoid a syscall per
//! job there is an atomic `signalled` flag: a worker, after pushing,
//! does `fence(SeqCst)` and writes the eventfd only if it flips `signalled`
//! from false to true. [`Pool::drain`] first clears the eventfd (only if it
//! was written since the last clear), then `signalled.swap(false)`,
//! `fence(SeqCst)`, then pops; if it leaves results behind (`max` reached) it
//! re-arms. A result pushed after the drain's pops missed it therefore sees
//! `signalled == false` and writes the fd: no lost wake-up, and at most
//! one write per drain round. The fd can occasionally be readable with
//! nothing to drain (harmless: `drain` returns an empty vector and clears
//! it). [`Pool::wait_result`] is the same protocol with `poll(2)`.
//!
//! ## Backpressure and close
//!
//! `capacity` bounds jobs in the pool from submission until their result is
//! drained, so memory is bounded and cancelling never blocks. When all slots
//! are taken `submit` waits (`Block(timeout)`) or fails at once (`Error`).
//! [`Pool::close`] makes new submissions fail, waits for submissions in
//! flight, then either lets the workers run everything queued
//! (`close(true)`) or cancels all queued and running jobs (`close(false)`),
//! and joins the workers. Nothing is lost either way: every accepted job
//! still gets its outcome, which stays available to `drain`.
//!
//! ## Statistics
//!
//! [`Pool::stats`]: queue depth per lane, running jobs, results pending,
//! outcome counts, panics, retries, worker utilisation (busy time / (workers ×
//! wall time); a worker is busy from finding a job until it finds the lanes
//! empty, timestamped only on those transitions) and jobs per second.
//! Per-worker counters are written by their own worker without
//! read-modify-write instructions.
//!
//! # Testing
//!
//! * `cargo test -p agentrl-scheduler` — unit tests, functional tests and
//!   multi-threaded stress tests (`tests/stress.rs`).
//! * Loom model checking of the queue and of the job state machine
//!   (`tests/loom.rs`), run with
//!
//!   ```text
//!   RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p agentrl-scheduler --release --test loom
//!   ```
//!
//!   Under `--cfg loom` the lock-free core uses loom's atomics, cells and
//!   mutex through the crate's `sync` facade.
//! * Benchmarks: `cargo bench -p agentrl-scheduler --bench queue` (queue vs
//!   `Mutex<VecDeque>` vs `crossbeam-channel`, and pool throughput).

#![warn(missing_docs)]

mod eventfd;
mod job;
mod pad;
mod pool;
pub mod queue;
mod sync;
mod table;
mod wait;

pub use job::{
    lane_of, lane_priority, InfraError, JobId, JobSpec, Outcome, OutcomeKind, MAX_PRIORITY,
    MIN_PRIORITY, PRIORITY_LANES,
};
pub use pad::CachePadded;
pub use pool::{
    Backpressure, BatchError, Config, Executor, Pool, RejectReason, Stats, SubmitError,
};
pub use table::{CancelSource, CancelToken, KillHookGuard};

/// The lock-free job table, exported only for the loom models in
/// `tests/loom.rs`. Not a stable API.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_internals {
    pub use crate::table::{Cancel, Claimed, Next, Table};
}
