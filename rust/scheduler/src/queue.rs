//! Bounded lock-free MPMC queue: **Dmitry Vyukov's bounded MPMC array queue
//! with per-cell sequence numbers** (written from the published description of
//! the algorithm, not from any existing implementation).
//!
//! # Algorithm
//!
//! The queue is a ring of `cap` cells (`cap` a power of two, at least 2) plus
//! two unbounded position counters, `tail` (next position to push) and `head`
//! (next position to pop). Position `pos` lives in cell `pos & (cap - 1)`.
//! Every cell carries a sequence number `seq` that says what the cell is
//! waiting for:
//!
//! * `seq == pos`       — empty, ready for the producer of position `pos`;
//! * `seq == pos + 1`   — full, ready for the consumer of position `pos`;
//! * `seq == pos + cap` — consumed, ready for the producer of `pos + cap` (the
//!   next lap), which is the first case again one lap later.
//!
//! Cell `i` starts with `seq == i`. A producer reads `pos = tail` and the seq
//! of its cell: if `seq == pos` it claims the position with a CAS
//! `tail: pos -> pos + 1`, writes the value and publishes it with
//! `seq = pos + 1`; if `seq < pos` the cell still holds last lap's value, so
//! the queue is full; if `seq > pos` another producer got there first and it
//! reloads `tail`. A consumer does the mirror image on `head`, expecting
//! `seq == pos + 1` and releasing the cell with `seq = pos + cap`. (With
//! `cap == 1` "full at `pos`" and "empty at `pos + 1`" would both read
//! `seq == pos + 1`, hence the minimum of 2.)
//!
//! Claiming is lock-free (a failed CAS means another thread made progress).
//! As with every array queue of this family a thread pre-empted between its
//! claim and its `seq` store makes *that one cell* look full/empty to the
//! other side until it resumes: `push` may report `Full` and `pop` may report
//! empty for that window. Callers in this crate treat both as transient.
//!
//! # Memory orderings
//!
//! * `seq` load: `Acquire`; `seq` store: `Release`. This pair is the only
//!   hand-off of the cell's data: the producer's write of the value
//!   happens-before the consumer's read (producer `Release` store of
//!   `pos + 1`, consumer `Acquire` load of it), and the consumer's read of the
//!   old value happens-before the next lap's producer overwrites it (consumer
//!   `Release` store of `pos + cap`, producer `Acquire` load).
//! * `head` / `tail` loads and CASes: `Relaxed`. They only arbitrate which
//!   thread owns which position among threads of the same side; no data is
//!   published through them, and a stale value only costs a retry (the seq
//!   comparison detects it).
//!
//! `head` and `tail` sit in separate [`CachePadded`] lines so producers and
//! consumers do not false-share.
//!
//! # Handles
//!
//! [`bounded`] returns a [`Producer`] and a [`Consumer`]; both are `Clone`
//! (any number of each: multi-producer, multi-consumer) and share the ring
//! through an `Arc`. The producer side can only push and the consumer side can
//! only pop.

use std::fmt;
use std::mem::MaybeUninit;

use crate::pad::CachePadded;
use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

#[cfg(loom)]
use loom::sync::Arc;
#[cfg(not(loom))]
use std::sync::Arc;

struct Cell<T> {
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// The shared ring. Crate-internal: the pool embeds it directly; outside
/// users get the typed [`Producer`] / [`Consumer`] handles.
pub(crate) struct ArrayQueue<T> {
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
    mask: usize,
    cells: Box<[Cell<T>]>,
}

// SAFETY: values of `T` are moved in by one thread and out by another, so `T`
// must be `Send`; all shared access to a cell's value is serialised by the
// seq protocol described in the module docs.
unsafe impl<T: Send> Send for ArrayQueue<T> {}
// SAFETY: as above; `&ArrayQueue` only allows push/pop, which transfer
// ownership of whole `T`s and never hand out references to them.
unsafe impl<T: Send> Sync for ArrayQueue<T> {}

impl<T> ArrayQueue<T> {
    /// Creates a queue that holds at least `min_capacity` items (rounded up
    /// to a power of two, minimum 2).
    pub(crate) fn new(min_capacity: usize) -> Self {
        let cap = min_capacity.max(2).next_power_of_two();
        let cells = (0..cap)
            .map(|i| Cell {
                seq: AtomicUsize::new(i),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect();
        Self {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            mask: cap - 1,
            cells,
        }
    }

    /// Number of cells.
    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Pushes `value`, or gives it back if the queue is full.
    pub(crate) fn push(&self, value: T) -> Result<(), T> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(pos) as isize;
            if diff == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the CAS made this thread the only owner of
                        // position `pos`; `seq == pos` (Acquire) proved the
                        // previous lap's consumer has finished reading the
                        // cell, and no consumer will touch it before the
                        // Release store below.
                        cell.value.with_mut(|p| unsafe { (*p).write(value) });
                        cell.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return Ok(());
                    }
                    Err(current) => pos = current,
                }
            } else if diff < 0 {
                return Err(value);
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Pops the oldest value, or `None` if the queue is (momentarily) empty.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(pos.wrapping_add(1)) as isize;
            if diff == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the CAS made this thread the only owner of
                        // position `pos`; `seq == pos + 1` (Acquire) proved the
                        // producer's write is complete and visible. The value
                        // is moved out exactly once, and the Release store
                        // below hands the now-logically-uninitialised cell to
                        // the next lap's producer.
                        let value = cell.value.with(|p| unsafe { (*p).assume_init_read() });
                        cell.seq
                            .store(pos.wrapping_add(self.mask + 1), Ordering::Release);
                        return Some(value);
                    }
                    Err(current) => pos = current,
                }
            } else if diff < 0 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Approximate number of items (exact when no push/pop is in flight).
    pub(crate) fn len(&self) -> usize {
        loop {
            let tail = self.tail.load(Ordering::SeqCst);
            let head = self.head.load(Ordering::SeqCst);
            // Re-read tail so that the pair is a consistent snapshot.
            if self.tail.load(Ordering::SeqCst) == tail {
                return tail.wrapping_sub(head).min(self.capacity());
            }
        }
    }

    /// True if no position has been claimed but not consumed. A push whose
    /// `tail` CAS is ordered before this call (e.g. through a `SeqCst` fence
    /// pair) makes it return `false`; the pool's wake-up protocol relies on
    /// that.
    pub(crate) fn is_empty(&self) -> bool {
        let head = self.head.load(Ordering::SeqCst);
        let tail = self.tail.load(Ordering::SeqCst);
        // `head` can run ahead of a stale `tail` read only if the queue was
        // empty in between; treat that as empty.
        (tail.wrapping_sub(head) as isize) <= 0
    }
}

impl<T> Drop for ArrayQueue<T> {
    fn drop(&mut self) {
        if std::mem::needs_drop::<T>() {
            while self.pop().is_some() {}
        }
    }
}

/// Error returned by [`Producer::push`] when the queue is full; gives the
/// value back.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct Full<T>(pub T);

impl<T> fmt::Debug for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Full(..)")
    }
}

impl<T> fmt::Display for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("queue is full")
    }
}

impl<T> std::error::Error for Full<T> {}

/// Creates a bounded MPMC queue holding at least `capacity` items (rounded up
/// to a power of two, minimum 2) and returns its two handles.
pub fn bounded<T: Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let q = Arc::new(ArrayQueue::new(capacity));
    (Producer { q: q.clone() }, Consumer { q })
}

/// Push side of a [`bounded`] queue. Clone it for more producers.
pub struct Producer<T> {
    q: Arc<ArrayQueue<T>>,
}

/// Pop side of a [`bounded`] queue. Clone it for more consumers.
pub struct Consumer<T> {
    q: Arc<ArrayQueue<T>>,
}

impl<T> Clone for Producer<T> {
    fn clone(&self) -> Self {
        Self { q: self.q.clone() }
    }
}

impl<T> Clone for Consumer<T> {
    fn clone(&self) -> Self {
        Self { q: self.q.clone() }
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.q.capacity())
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.q.capacity())
            .finish_non_exhaustive()
    }
}

impl<T> Producer<T> {
    /// Pushes without blocking; gives `value` back if the queue is full.
    #[inline]
    pub fn push(&self, value: T) -> Result<(), Full<T>> {
        self.q.push(value).map_err(Full)
    }

    /// Number of cells (the requested capacity rounded up).
    pub fn capacity(&self) -> usize {
        self.q.capacity()
    }

    /// Approximate number of queued items.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// True if the queue looks empty.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

impl<T> Consumer<T> {
    /// Pops the oldest item without blocking.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        self.q.pop()
    }

    /// Number of cells (the requested capacity rounded up).
    pub fn capacity(&self) -> usize {
        self.q.capacity()
    }

    /// Approximate number of queued items.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// True if the queue looks empty.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;

    #[test]
    fn fifo_and_full() {
        let (p, c) = bounded::<u32>(3);
        assert_eq!(p.capacity(), 4);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(Full(9)));
        assert_eq!(p.len(), 4);
        for i in 0..4 {
            assert_eq!(c.pop(), Some(i));
        }
        assert_eq!(c.pop(), None);
        assert!(c.is_empty());
        // Wrap around many laps.
        for i in 0..1000 {
            p.push(i).unwrap();
            assert_eq!(c.pop(), Some(i));
        }
    }

    #[test]
    fn drops_leftovers() {
        static DROPS: StdAtomicUsize = StdAtomicUsize::new(0);
        struct D;
        impl Drop for D {
            fn drop(&mut self) {
                DROPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let (p, c) = bounded(8);
        for _ in 0..5 {
            p.push(D).unwrap();
        }
        drop(c.pop());
        drop((p, c));
        assert_eq!(DROPS.load(std::sync::atomic::Ordering::Relaxed), 5);
    }

    #[test]
    fn mpmc_threads_no_loss_no_dup() {
        const PER: usize = 20_000;
        const PRODUCERS: usize = 4;
        let (p, c) = bounded::<usize>(64);
        let seen: Vec<_> = (0..PER * PRODUCERS)
            .map(|_| StdAtomicUsize::new(0))
            .collect();
        let seen = std::sync::Arc::new(seen);
        let popped = std::sync::Arc::new(StdAtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..PRODUCERS {
                let p = p.clone();
                s.spawn(move || {
                    for i in 0..PER {
                        let mut v = t * PER + i;
                        while let Err(Full(back)) = p.push(v) {
                            v = back;
                            std::thread::yield_now();
                        }
                    }
                });
            }
            for _ in 0..3 {
                let c = c.clone();
                let seen = seen.clone();
                let popped = popped.clone();
                s.spawn(move || {
                    let mut last = [None::<usize>; PRODUCERS];
                    while popped.load(std::sync::atomic::Ordering::Relaxed) < PER * PRODUCERS {
                        match c.pop() {
                            Some(v) => {
                                // Per-producer FIFO as seen by one consumer.
                                let (t, i) = (v / PER, v % PER);
                                if let Some(prev) = last[t] {
                                    assert!(i > prev);
                                }
                                last[t] = Some(i);
                                seen[v].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                popped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            None => std::thread::yield_now(),
                        }
                    }
                });
            }
        });
        assert!(seen
            .iter()
            .all(|n| n.load(std::sync::atomic::Ordering::Relaxed) == 1));
    }
}
