//! Job-level value types shared by the table and the pool.

use std::fmt;
use std::time::Instant;

/// Lowest priority that gets its own lane; lower priorities are clamped to it.
pub const MIN_PRIORITY: i32 = -3;
/// Highest priority that gets its own lane; higher priorities are clamped to it.
pub const MAX_PRIORITY: i32 = 3;
/// Number of priority lanes (`MIN_PRIORITY..=MAX_PRIORITY`).
pub const PRIORITY_LANES: usize = (MAX_PRIORITY - MIN_PRIORITY + 1) as usize;

/// Lane index of a priority: the priority clamped to
/// `MIN_PRIORITY..=MAX_PRIORITY`, shifted so that lane 0 is `MIN_PRIORITY`.
/// Workers serve the highest non-empty lane first; each lane is FIFO.
#[inline]
pub fn lane_of(priority: i32) -> usize {
    (priority.clamp(MIN_PRIORITY, MAX_PRIORITY) - MIN_PRIORITY) as usize
}

/// Priority served by lane `lane` (inverse of [`lane_of`] on the clamped
/// range).
#[inline]
pub fn lane_priority(lane: usize) -> i32 {
    MIN_PRIORITY + lane as i32
}

/// Identifier the pool assigns to a submitted job.
///
/// Encoding: the low 32 bits are the index of the job's slot in the pool's
/// job table, the high 32 bits that slot's generation (bumped on every reuse,
/// never 0). Ids are therefore never 0 and are unique until one slot has been
/// reused 2^32 times. Treat them as opaque.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct JobId(pub u64);

impl JobId {
    /// The raw `u64`.
    #[inline]
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({:#x})", self.0)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<JobId> for u64 {
    fn from(id: JobId) -> u64 {
        id.0
    }
}

/// A job as submitted: the executor's payload plus scheduling attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec<J> {
    /// Handed to [`Executor::execute`](crate::Executor::execute) by reference.
    pub payload: J,
    /// Group for [`Pool::cancel_group`](crate::Pool::cancel_group).
    pub group: u64,
    /// Higher runs first; clamped to `MIN_PRIORITY..=MAX_PRIORITY` (see
    /// [`lane_of`]); FIFO within one lane.
    pub priority: i32,
    /// If this instant passes before the job starts, it ends as
    /// [`Outcome::Expired`] without running.
    pub deadline: Option<Instant>,
}

impl<J> JobSpec<J> {
    /// A job in group 0, priority 0, without deadline.
    pub fn new(payload: J) -> Self {
        Self {
            payload,
            group: 0,
            priority: 0,
            deadline: None,
        }
    }

    /// Sets the group.
    pub fn group(mut self, group: u64) -> Self {
        self.group = group;
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the deadline.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }
}

/// The single terminal result of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<R> {
    /// The executor returned `Ok`.
    Completed(R),
    /// Cancelled by [`Pool::cancel`](crate::Pool::cancel),
    /// [`Pool::cancel_group`](crate::Pool::cancel_group) or
    /// [`Pool::close`](crate::Pool::close)`(false)`, either before it started
    /// or while it ran (any value the executor returned is dropped).
    Cancelled,
    /// Its deadline passed before it started (or before a retry attempt could
    /// start). A job that is already running is never interrupted by its
    /// deadline; the executor can read it from
    /// [`CancelToken::deadline`](crate::CancelToken::deadline).
    Expired,
    /// The executor panicked (the message says `executor panicked: ...`), or
    /// kept returning [`InfraError`] until the retries ran out (the message
    /// carries the last infrastructure reason).
    Failed(String),
}

impl<R> Outcome<R> {
    /// The kind of outcome, without the value.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Completed(_) => OutcomeKind::Completed,
            Outcome::Cancelled => OutcomeKind::Cancelled,
            Outcome::Expired => OutcomeKind::Expired,
            Outcome::Failed(_) => OutcomeKind::Failed,
        }
    }
}

/// [`Outcome`] without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// See [`Outcome::Completed`].
    Completed,
    /// See [`Outcome::Cancelled`].
    Cancelled,
    /// See [`Outcome::Expired`].
    Expired,
    /// See [`Outcome::Failed`].
    Failed,
}

/// An infrastructure failure reported by an executor (the sandbox could not be
/// started, a transient I/O error...). Unlike a program's own failure, which
/// the executor reports inside its `Ok` output, an infrastructure error is
/// retried up to [`Config::retries`](crate::Config::retries) times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfraError {
    /// Human-readable reason; ends up in [`Outcome::Failed`] when retries are
    /// exhausted.
    pub reason: String,
}

impl InfraError {
    /// An infrastructure error with this reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for InfraError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "infrastructure error: {}", self.reason)
    }
}

impl std::error::Error for InfraError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_clamp() {
        assert_eq!(lane_of(i32::MIN), 0);
        assert_eq!(lane_of(-3), 0);
        assert_eq!(lane_of(0), 3);
        assert_eq!(lane_of(3), PRIORITY_LANES - 1);
        assert_eq!(lane_of(i32::MAX), PRIORITY_LANES - 1);
        for l in 0..PRIORITY_LANES {
            assert_eq!(lane_of(lane_priority(l)), l);
        }
    }
}
