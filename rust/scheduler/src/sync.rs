//! Synchronisation facade: `std` primitives normally, `loom`'s model-checked
//! ones under `--cfg loom`.
//!
//! Only the lock-free core (the queue in [`crate::queue`] and the job table in
//! `table`) goes through this module, so that loom can explore every
//! interleaving of its atomics and cells. The worker pool's parking, eventfd
//! and threads use `std` directly: they are not part of the loom models.
//!
//! `std::cell::UnsafeCell` is wrapped so that it has loom's closure-based API
//! (`with` / `with_mut`), which lets loom track every access to cell contents.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// `std::cell::UnsafeCell` with loom's access API.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared pointer to the contents. The caller is
    /// responsible for there being no concurrent `with_mut`.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a unique pointer to the contents. The caller is
    /// responsible for exclusive access.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Busy-wait hint for a spin loop that waits on another thread. Under loom a
/// spin loop must yield, or the model checker would explore it forever.
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
