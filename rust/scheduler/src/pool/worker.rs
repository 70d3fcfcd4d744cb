//! The workers: the worker loop (spin, then park), running a job with its
//! deadline, retries after an `InfraError`, and panic handling.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use crate::job::Outcome;
use crate::table::{drop_quietly, Claimed, Next};

use super::stats::{bump, WorkerCounters};
use super::{Executor, Shared};

impl<E: Executor> Shared<E> {
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

pub(super) fn worker_main<E: Executor>(s: &Shared<E>, w: usize) {
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
