//! Parking for idle workers and for submitters blocked on a full pool.
//!
//! A mutex + condvar with an atomic waiter count so that the notifying side
//! (the hot path) costs one `SeqCst` fence and one load when nobody sleeps.
//!
//! Lost wake-ups are excluded by a Dekker-style handshake:
//!
//! * waiter: lock; `waiters += 1` (`SeqCst`); `SeqCst` fence; check the
//!   condition; if false, `Condvar::wait` (atomically unlocks);
//! * notifier: make the condition true (e.g. push a job); `SeqCst` fence;
//!   load `waiters`; if non-zero, lock and `notify`.
//!
//! By the fence rules of the C++/Rust memory model, either the waiter's check
//! sees the notifier's change, or the notifier's load sees the waiter's
//! increment. In the second case the notifier takes the mutex, which it can
//! only get once the waiter is inside `wait` (or before its next check), so
//! the notification cannot fall between the waiter's check and its sleep.

use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl WaitQueue {
    /// Sleeps until `ready()` holds or `deadline` passes. Returns the last
    /// value of `ready()`.
    pub(crate) fn wait_until(&self, ready: impl Fn() -> bool, deadline: Option<Instant>) -> bool {
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let result = loop {
            if ready() {
                break true;
            }
            match deadline {
                None => guard = self.cv.wait(guard).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break false;
                    }
                    guard = self
                        .cv
                        .wait_timeout(guard, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
        result
    }

    /// Wakes one waiter, if any. Call after making the condition true.
    #[inline]
    pub(crate) fn notify_one(&self) {
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_one();
        }
    }

    /// Wakes all waiters, if any. Call after making the condition true.
    #[inline]
    pub(crate) fn notify_all(&self) {
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }
}
