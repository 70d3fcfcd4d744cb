//! Loom models of the lock-free parts: the Vyukov queue and the job table's
//! state machine (claim vs cancel vs drain vs slot reuse, kill hooks).
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p agentrl-scheduler --release --test loom
//! ```
//!
//! Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use agentrl_scheduler::loom_internals::{Cancel, Next, Table};
use agentrl_scheduler::queue;
use agentrl_scheduler::{JobId, JobSpec, Outcome};

/// Runs a model with the preemption bound from `LOOM_MAX_PREEMPTIONS`,
/// defaulting to 3 so that a plain `--cfg loom` run stays fast.
fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// 2 producers + 1 consumer on a capacity-2 queue, 3 pushes (so the queue
/// can be full) and 2 concurrent pops. No retry loops, so every execution is
/// finite: pushes may fail with `Full`, pops may find the queue empty.
/// Checked: every successfully pushed item comes out exactly once (popped
/// concurrently or left for the final drain), nothing else comes out, a push
/// only fails when the ring really held 2 items, and items of one producer
/// come out in the order they went in.
#[test]
fn queue_two_producers_one_consumer_capacity_two() {
    model(|| {
        let (p, c) = queue::bounded::<u32>(2);
        let p2 = p.clone();
        let c2 = c.clone();
        let a = thread::spawn(move || [p.push(1).is_ok(), p.push(2).is_ok()]);
        let b = thread::spawn(move || p2.push(3).is_ok());
        let consumer = thread::spawn(move || {
            let mut got = Vec::new();
            for _ in 0..2 {
                if let Some(v) = c2.pop() {
                    got.push(v);
                }
            }
            got
        });
        let [ok1, ok2] = a.join().unwrap();
        let ok3 = b.join().unwrap();
        let mut got = consumer.join().unwrap();
        while let Some(v) = c.pop() {
            got.push(v);
        }
        let mut expected: Vec<u32> = [(ok1, 1), (ok2, 2), (ok3, 3)]
            .into_iter()
            .filter_map(|(ok, v)| ok.then_some(v))
            .collect();
        if !(ok1 && ok2 && ok3) {
            assert!(expected.len() >= 2, "Full reported with fewer than 2 items");
        }
        if ok1 && ok2 {
            let pos = |x| got.iter().position(|&v| v == x).unwrap();
            assert!(pos(1) < pos(2), "per-producer FIFO violated: {got:?}");
        }
        got.sort_unstable();
        expected.sort_unstable();
        assert_eq!(got, expected, "lost or duplicated item");
    });
}

/// Push/pop linearizability at the full and empty boundaries: a concurrent
/// pop and push on a full capacity-2 queue. The push may only fail if it did
/// not see the pop's release, the pop always succeeds, and nothing is lost
/// or duplicated; after both complete the queue holds exactly what the
/// sequential history says, in FIFO order.
#[test]
fn queue_push_pop_linearizable_at_boundaries() {
    model(|| {
        let (p, c) = queue::bounded::<u32>(2);
        p.push(1).unwrap();
        p.push(2).unwrap();
        let c2 = c.clone();
        let popper = thread::spawn(move || c2.pop());
        let pushed = p.push(3).is_ok();
        let popped = popper.join().unwrap();
        assert_eq!(popped, Some(1), "the oldest item must come out first");
        let mut rest = Vec::new();
        while let Some(v) = c.pop() {
            rest.push(v);
        }
        if pushed {
            assert_eq!(rest, vec![2, 3]);
        } else {
            assert_eq!(rest, vec![2]);
        }
    });
}

/// Concurrent pop from an empty-then-filled queue: a pop that returns
/// `None` must leave the item for a later pop, one that returns it must be
/// the only one.
#[test]
fn queue_concurrent_pops_no_duplicate() {
    model(|| {
        let (p, c) = queue::bounded::<u32>(2);
        let c2 = c.clone();
        let producer = thread::spawn(move || p.push(7).unwrap());
        let other = thread::spawn(move || c2.pop());
        let mine = c.pop();
        producer.join().unwrap();
        let theirs = other.join().unwrap();
        let later = c.pop();
        let all: Vec<_> = [mine, theirs, later].into_iter().flatten().collect();
        assert_eq!(all, vec![7]);
    });
}

type T = Table<u32, u32>;

/// Drains everything and returns the results.
fn drain_all(t: &T) -> Vec<(JobId, Outcome<u32>)> {
    let mut out = Vec::new();
    while let Some(r) = t.pop_done() {
        out.push(r);
    }
    out
}

/// Runs the worker side until the lanes are empty.
fn work_all(t: &T) {
    loop {
        match t.next() {
            Next::Job(job) => {
                let v = *job.payload();
                job.finish(Outcome::Completed(v * 10));
            }
            Next::Skipped => {}
            Next::Empty => return,
        }
    }
}

/// Cancel races a worker's claim of the same queued job: exactly one
/// terminal result, `Cancelled` iff `cancel` said so, and the slot is free
/// again afterwards (capacity 1).
#[test]
fn cancel_vs_start_exactly_one_result() {
    model(|| {
        let t = Arc::new(T::new(1, 1));
        let id = t.try_submit(JobSpec::new(4), 0).unwrap();
        let t2 = t.clone();
        let worker = thread::spawn(move || match t2.next() {
            Next::Job(job) => {
                let v = *job.payload();
                job.finish(Outcome::Completed(v * 10));
            }
            Next::Skipped => {}
            Next::Empty => panic!("the entry was queued before the worker started"),
        });
        let cancelled = t.cancel(id);
        worker.join().unwrap();
        let results = drain_all(&t);
        assert_eq!(results.len(), 1, "exactly one terminal result");
        assert_eq!(results[0].0, id);
        match cancelled {
            Cancel::Queued | Cancel::Running => assert_eq!(results[0].1, Outcome::Cancelled),
            Cancel::No => assert_eq!(results[0].1, Outcome::Completed(40)),
        }
        // Both references are gone: the only slot is reusable, with a new id.
        let id2 = t.try_submit(JobSpec::new(5), 0).unwrap();
        assert_ne!(id2, id);
        assert_eq!(
            t.cancel(id),
            Cancel::No,
            "stale id must not touch the new job"
        );
        work_all(&t);
        assert_eq!(drain_all(&t), vec![(id2, Outcome::Completed(50))]);
    });
}

/// A job cancelled while queued: the drainer takes the result and frees the
/// slot concurrently with the worker popping the stale lane entry, and the
/// drainer immediately tries to reuse the slot. Whichever of drain and lane
/// pop comes last frees the slot, exactly once; the stale entry never runs
/// the new job; every job gets one result.
#[test]
fn cancelled_slot_release_and_reuse() {
    model(|| {
        let t = Arc::new(T::new(1, 1));
        let id1 = t.try_submit(JobSpec::new(1), 0).unwrap();
        assert_eq!(t.cancel(id1), Cancel::Queued);
        let t2 = t.clone();
        let worker = thread::spawn(move || {
            // Pops the stale entry of id1 (and possibly runs id2).
            work_all(&t2);
        });
        let t3 = t.clone();
        let drainer = thread::spawn(move || {
            let first = loop {
                if let Some(r) = t3.pop_done() {
                    break r;
                }
                thread::yield_now();
            };
            // Free only once the worker has also dropped its reference.
            let second = t3.try_submit(JobSpec::new(2), 0).ok();
            (first, second)
        });
        worker.join().unwrap();
        let (first, id2) = drainer.join().unwrap();
        assert_eq!(first, (id1, Outcome::Cancelled));
        work_all(&t);
        let rest = drain_all(&t);
        match id2 {
            Some(id2) => assert_eq!(rest, vec![(id2, Outcome::Completed(20))]),
            None => assert!(rest.is_empty()),
        }
        // The slot is free again.
        let id3 = t.try_submit(JobSpec::new(3), 0).unwrap();
        assert!(t.try_submit(JobSpec::new(9), 0).is_err(), "capacity is 1");
        assert_eq!(t.cancel(id3), Cancel::Queued);
    });
}

/// Cancel races a running job that registers and unregisters a kill hook and
/// finishes: the hook runs at most once, never after its guard was dropped,
/// only if `cancel` returned `Running`, and `Running` always yields
/// `Cancelled`.
#[test]
fn cancel_running_kill_hook() {
    model(|| {
        let t = Arc::new(T::new(1, 1));
        let id = t.try_submit(JobSpec::new(6), 0).unwrap();
        let job = match t.next() {
            Next::Job(job) => job,
            _ => unreachable!(),
        };
        // The claim happened on this thread; the job now runs on `worker`.
        let hook_runs = Arc::new(AtomicUsize::new(0));
        let guard_dropped = Arc::new(AtomicBool::new(false));
        let t2 = t.clone();
        let canceller = thread::spawn(move || t2.cancel(id));
        {
            let token = job.token(0);
            let (runs, dropped) = (hook_runs.clone(), guard_dropped.clone());
            let guard = token.on_cancel(move || {
                assert!(
                    !dropped.load(Ordering::SeqCst),
                    "hook ran after unregistering"
                );
                runs.fetch_add(1, Ordering::SeqCst);
            });
            drop(guard);
            guard_dropped.store(true, Ordering::SeqCst);
        }
        job.finish(Outcome::Completed(60));
        let cancelled = canceller.join().unwrap();
        let results = drain_all(&t);
        assert_eq!(results.len(), 1);
        let runs = hook_runs.load(Ordering::SeqCst);
        assert!(runs <= 1);
        match cancelled {
            Cancel::Running => assert_eq!(results[0].1, Outcome::Cancelled),
            Cancel::No => {
                assert_eq!(results[0].1, Outcome::Completed(60));
                assert_eq!(runs, 0);
            }
            Cancel::Queued => panic!("job was already running"),
        }
    });
}
