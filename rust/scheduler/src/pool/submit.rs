//! Submission: [`Pool::submit`] and [`Pool::submit_many`] with backpressure,
//! and the errors that give refused jobs back.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::job::{lane_of, JobId, JobSpec};

use super::{Backpressure, Executor, Pool};

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

/// Registers an in-flight submission (see `Shared::submitters`).
struct SubmitGuard<'a>(&'a AtomicUsize);

impl Drop for SubmitGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<E: Executor> Pool<E> {
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
}
