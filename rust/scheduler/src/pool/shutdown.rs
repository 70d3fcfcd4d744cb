//! Shutdown: [`Pool::close`] and dropping the pool (also in a `fork()` child).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use super::{Executor, Pool};

impl<E: Executor> Pool<E> {
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
    ///
    /// [`RejectReason::Closed`]: crate::RejectReason::Closed
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
