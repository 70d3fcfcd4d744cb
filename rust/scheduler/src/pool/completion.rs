//! Completion: results through the completion queue and the eventfd
//! ([`Pool::completion_fd`], [`Pool::drain`], [`Pool::wait_result`]); see the
//! crate docs, "Completion wake-ups".

use std::os::fd::RawFd;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use crate::job::{JobId, Outcome};

use super::{Executor, Pool, Shared};

impl<E: Executor> Pool<E> {
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
}

impl<E: Executor> Shared<E> {
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
    pub(super) fn signal_completion(&self) {
        // Pairs with the consumer's `swap(false)` + fence in `drain_into`.
        fence(Ordering::SeqCst);
        if !self.signalled.load(Ordering::Relaxed) {
            self.arm();
        }
    }
}
