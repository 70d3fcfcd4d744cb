//! Cancellation: [`Pool::cancel`], [`Pool::cancel_group`] and the group scan
//! shared with `close(false)`.

use std::sync::atomic::Ordering;

use crate::job::JobId;
use crate::table::Cancel;

use super::{Executor, Pool, Shared};

impl<E: Executor> Pool<E> {
    /// Cancels a job. A queued job never starts and its `Cancelled` result is
    /// published at once; a running job's kill hook is called and it reports
    /// `Cancelled` when its executor returns. Returns true iff this call
    /// cancelled the job (i.e. its outcome will be [`Outcome::Cancelled`]);
    /// false for unknown ids, finished or finishing jobs, and jobs already
    /// cancelled.
    ///
    /// [`Outcome::Cancelled`]: crate::Outcome::Cancelled
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
}

impl<E: Executor> Shared<E> {
    pub(super) fn cancel_where(&self, pred: impl FnMut(u64) -> bool) -> usize {
        let (queued, running) = self.table.cancel_where(pred);
        if queued > 0 {
            self.cancelled_outside
                .fetch_add(queued as u64, Ordering::Relaxed);
            self.signal_completion();
        }
        queued + running
    }
}
