//! Functional tests of the pool's behaviour, one feature at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use agentrl_scheduler::{
    Backpressure, CancelSource, CancelToken, Config, Executor, InfraError, JobId, JobSpec, Outcome,
    Pool, RejectReason, MAX_PRIORITY,
};

type JobFn = Box<dyn Fn(&CancelToken<'_>) -> Result<u64, InfraError> + Send + Sync>;

/// Runs closures.
struct Closures;

impl Executor for Closures {
    type Job = JobFn;
    type Output = u64;
    fn execute(&self, job: &JobFn, cancel: &CancelToken<'_>) -> Result<u64, InfraError> {
        job(cancel)
    }
}

fn job(
    f: impl Fn(&CancelToken<'_>) -> Result<u64, InfraError> + Send + Sync + 'static,
) -> JobSpec<JobFn> {
    JobSpec::new(Box::new(f) as JobFn)
}

fn pool(workers: usize, capacity: usize) -> Pool<Closures> {
    Pool::new(
        Closures,
        Config {
            workers,
            capacity,
            ..Config::default()
        },
    )
    .unwrap()
}

const T: Duration = Duration::from_secs(10);

/// A latch: `wait` blocks until `open`. Opens itself when the test's handle
/// is dropped (e.g. by a failing assertion), so that the pool's `Drop` does
/// not wait forever on a worker stuck behind it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

struct GateHandle(Arc<Gate>);

impl Drop for GateHandle {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl std::ops::Deref for GateHandle {
    type Target = Arc<Gate>;
    fn deref(&self) -> &Arc<Gate> {
        &self.0
    }
}

fn gate() -> GateHandle {
    GateHandle(Arc::new(Gate::default()))
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
    fn wait(&self) {
        let g = self.open.lock().unwrap();
        let _g = self.cv.wait_while(g, |o| !*o).unwrap();
    }
}

/// Submits a job that blocks its worker until the gate opens; waits until it
/// runs.
fn block_worker(p: &Pool<Closures>, gate: &Arc<Gate>) -> JobId {
    let started = Arc::new(AtomicBool::new(false));
    let (g, s) = (gate.clone(), started.clone());
    let id = p
        .submit(job(move |_| {
            s.store(true, Ordering::SeqCst);
            g.wait();
            Ok(0)
        }))
        .unwrap();
    let t0 = Instant::now();
    while !started.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < T);
        std::thread::yield_now();
    }
    id
}

fn collect(p: &Pool<Closures>, n: usize) -> HashMap<JobId, Outcome<u64>> {
    let mut out = HashMap::new();
    while out.len() < n {
        let (id, o) = p.wait_result(T).expect("result in time");
        assert!(out.insert(id, o).is_none(), "duplicate result");
    }
    out
}

#[test]
fn completes_and_reports_through_wait_result() {
    let p = pool(2, 64);
    let ids: Vec<_> = (0..10u64)
        .map(|i| p.submit(job(move |_| Ok(i * 2))).unwrap())
        .collect();
    let res = collect(&p, 10);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(res[id], Outcome::Completed(i as u64 * 2));
    }
    assert!(p.drain(10).is_empty());
    let st = p.stats();
    assert_eq!((st.submitted, st.completed, st.finished()), (10, 10, 10));
    assert_eq!(st.workers_alive, 2);
    p.close(true);
}

#[test]
fn priorities_then_fifo() {
    let p = pool(1, 64);
    let gate = gate();
    block_worker(&p, &gate);
    let order = Arc::new(Mutex::new(Vec::new()));
    let prios = [0, 5, -1, 2, 0, 2, i32::MIN, MAX_PRIORITY, 1];
    for (i, &prio) in prios.iter().enumerate() {
        let o = order.clone();
        p.submit(
            job(move |_| {
                o.lock().unwrap().push(i);
                Ok(0)
            })
            .priority(prio),
        )
        .unwrap();
    }
    gate.open();
    collect(&p, prios.len() + 1);
    // 5 and MAX_PRIORITY share the top lane (clamping), FIFO inside it.
    assert_eq!(*order.lock().unwrap(), vec![1, 7, 3, 5, 8, 0, 4, 2, 6]);
}

#[test]
fn cancel_queued_never_runs() {
    let p = pool(1, 16);
    let gate = gate();
    let blocker = block_worker(&p, &gate);
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let id = p
        .submit(job(move |_| {
            r.store(true, Ordering::SeqCst);
            Ok(1)
        }))
        .unwrap();
    assert!(p.cancel(id));
    assert!(!p.cancel(id), "second cancel is a no-op");
    // Published at once, while the worker is still blocked.
    assert_eq!(p.wait_result(T), Some((id, Outcome::Cancelled)));
    gate.open();
    assert_eq!(p.wait_result(T), Some((blocker, Outcome::Completed(0))));
    p.close(true);
    assert!(!ran.load(Ordering::SeqCst));
    assert!(!p.cancel(id));
    let st = p.stats();
    assert_eq!((st.cancelled, st.completed), (1, 1));
}

#[test]
fn cancel_running_fires_kill_hook() {
    let p = pool(1, 16);
    let killed = Arc::new(Gate::default());
    let k = killed.clone();
    let hook_calls = Arc::new(AtomicU32::new(0));
    let h = hook_calls.clone();
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let id = p
        .submit(job(move |tok| {
            let k2 = k.clone();
            let h2 = h.clone();
            let _guard = tok.on_cancel(move || {
                h2.fetch_add(1, Ordering::SeqCst);
                k2.open();
            });
            s.store(true, Ordering::SeqCst);
            k.wait(); // "the sandboxed process" runs until killed
            assert!(tok.is_cancelled());
            Ok(7) // discarded: the job was cancelled
        }))
        .unwrap();
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    assert!(p.cancel(id));
    assert!(!p.cancel(id));
    assert_eq!(p.wait_result(T), Some((id, Outcome::Cancelled)));
    assert_eq!(hook_calls.load(Ordering::SeqCst), 1);
    // A later job in the same slot is unaffected.
    let id2 = p
        .submit(job(|tok| Ok(u64::from(tok.is_cancelled()))))
        .unwrap();
    assert_eq!(p.wait_result(T), Some((id2, Outcome::Completed(0))));
}

#[test]
fn hook_registered_after_cancel_runs_immediately_and_guard_unregisters() {
    let src = CancelSource::new();
    let tok = src.token();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let guard = tok.on_cancel(move || {
        c.fetch_add(1, Ordering::SeqCst);
    });
    drop(guard);
    assert!(src.cancel());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "unregistered hook must not run"
    );
    let c = calls.clone();
    let _g = tok.on_cancel(move || {
        c.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "already cancelled: runs at once"
    );
    assert!(!src.cancel());
}

#[test]
fn cancel_group_hits_queued_and_running() {
    let p = pool(2, 64);
    let gate = gate();
    // One running job of group 7 that waits for its kill hook.
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let running = p
        .submit(
            job(move |tok| {
                let killed = Arc::new(Gate::default());
                let k = killed.clone();
                let _g = tok.on_cancel(move || k.open());
                s.store(true, Ordering::SeqCst);
                killed.wait();
                Ok(0)
            })
            .group(7),
        )
        .unwrap();
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let blocker = block_worker(&p, &gate);
    let queued7: Vec<_> = (0..5)
        .map(|_| p.submit(job(|_| Ok(1)).group(7)).unwrap())
        .collect();
    let other: Vec<_> = (0..3)
        .map(|_| p.submit(job(|_| Ok(2)).group(8)).unwrap())
        .collect();
    assert_eq!(p.cancel_group(7), 6);
    assert_eq!(p.cancel_group(7), 0);
    gate.open();
    let res = collect(&p, 10);
    assert_eq!(res[&running], Outcome::Cancelled);
    for id in &queued7 {
        assert_eq!(res[id], Outcome::Cancelled);
    }
    for id in &other {
        assert_eq!(res[id], Outcome::Completed(2));
    }
    assert_eq!(res[&blocker], Outcome::Completed(0));
}

#[test]
fn deadline_expires_before_start() {
    let p = pool(1, 16);
    let gate = gate();
    block_worker(&p, &gate);
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let soon = Instant::now() + Duration::from_millis(20);
    let late = p
        .submit(
            job(move |_| {
                r.store(true, Ordering::SeqCst);
                Ok(1)
            })
            .deadline(soon),
        )
        .unwrap();
    let ok = p
        .submit(job(|tok| Ok(u64::from(tok.deadline().is_some()))).deadline(Instant::now() + T))
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    gate.open();
    let res = collect(&p, 3);
    assert_eq!(res[&late], Outcome::Expired);
    assert_eq!(res[&ok], Outcome::Completed(1));
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(p.stats().expired, 1);
}

#[test]
fn infra_errors_are_retried_program_results_are_not() {
    let p = Pool::new(
        Closures,
        Config {
            workers: 1,
            capacity: 16,
            retries: 2,
            ..Config::default()
        },
    )
    .unwrap();
    // Fails twice, then succeeds on the third attempt.
    let tries = Arc::new(AtomicU32::new(0));
    let t = tries.clone();
    let recovers = p
        .submit(job(move |tok| {
            assert_eq!(tok.attempt(), t.fetch_add(1, Ordering::SeqCst));
            if tok.attempt() < 2 {
                Err(InfraError::new("sandbox did not start"))
            } else {
                Ok(u64::from(tok.attempt()))
            }
        }))
        .unwrap();
    let gives_up = p
        .submit(job(|_| Err(InfraError::new("disk full"))))
        .unwrap();
    // A program failure is an Ok output: never retried.
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let program_fails = p
        .submit(job(move |_| {
            a.fetch_add(1, Ordering::SeqCst);
            Ok(u64::MAX) // "exit code 255"
        }))
        .unwrap();
    let res = collect(&p, 3);
    assert_eq!(res[&recovers], Outcome::Completed(2));
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    match &res[&gives_up] {
        Outcome::Failed(msg) => {
            assert!(
                msg.contains("disk full") && msg.contains("3 attempt"),
                "{msg}"
            )
        }
        o => panic!("unexpected {o:?}"),
    }
    assert_eq!(res[&program_fails], Outcome::Completed(u64::MAX));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    let st = p.stats();
    assert_eq!((st.retries, st.failed, st.completed), (4, 1, 2));
}

#[test]
fn panics_fail_the_job_and_keep_the_workers() {
    quiet_panics();
    let p = pool(2, 64);
    let ids: Vec<_> = (0..20u64)
        .map(|i| {
            p.submit(job(move |_| {
                if i % 2 == 0 {
                    panic!("boom {i}");
                }
                Ok(i)
            }))
            .unwrap()
        })
        .collect();
    let res = collect(&p, 20);
    for (i, id) in ids.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(
                res[id],
                Outcome::Failed(format!("executor panicked: boom {i}"))
            );
        } else {
            assert_eq!(res[id], Outcome::Completed(i as u64));
        }
    }
    let st = p.stats();
    assert_eq!((st.panics, st.failed, st.workers_alive), (10, 10, 2));
    // Still works.
    let id = p.submit(job(|_| Ok(5))).unwrap();
    assert_eq!(p.wait_result(T), Some((id, Outcome::Completed(5))));
}

#[test]
fn backpressure_error_and_block() {
    let p = Pool::new(
        Closures,
        Config {
            workers: 1,
            capacity: 2,
            backpressure: Backpressure::Error,
            ..Config::default()
        },
    )
    .unwrap();
    let gate = gate();
    block_worker(&p, &gate);
    let queued = p.submit(job(|_| Ok(1))).unwrap();
    let err = p.submit(job(|_| Ok(2))).unwrap_err();
    assert_eq!(err.reason, RejectReason::Full);
    // The job comes back intact.
    assert_eq!((err.spec.payload)(&CancelSource::new().token()), Ok(2));
    gate.open();
    let res = collect(&p, 2);
    assert_eq!(res[&queued], Outcome::Completed(1));
    assert_eq!(p.stats().pending_results, 0);

    let p = Arc::new(
        Pool::new(
            Closures,
            Config {
                workers: 1,
                capacity: 1,
                backpressure: Backpressure::Block(Duration::from_millis(50)),
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let first = p.submit(job(|_| Ok(1))).unwrap();
    // Result not drained: the slot stays taken, so this blocks then fails.
    let t0 = Instant::now();
    let err = p.submit(job(|_| Ok(2))).unwrap_err();
    assert_eq!(err.reason, RejectReason::Full);
    assert!(t0.elapsed() >= Duration::from_millis(45));
    // A consumer that drains unblocks a blocked submitter.
    let p2 = p.clone();
    let consumer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        p2.wait_result(T)
    });
    let p3 = p.clone();
    let second = std::thread::spawn(move || {
        let p = p3;
        // Block(50ms) may be too short on a loaded machine; retry.
        loop {
            match p.submit(job(|_| Ok(2))) {
                Ok(id) => return id,
                Err(e) => assert_eq!(e.reason, RejectReason::Full),
            }
        }
    });
    assert_eq!(
        consumer.join().unwrap(),
        Some((first, Outcome::Completed(1)))
    );
    let second = second.join().unwrap();
    assert_eq!(p.wait_result(T), Some((second, Outcome::Completed(2))));
}

#[test]
fn submit_many_partial_and_close() {
    let p = Pool::new(
        Closures,
        Config {
            workers: 1,
            capacity: 4,
            backpressure: Backpressure::Error,
            ..Config::default()
        },
    )
    .unwrap();
    let gate = gate();
    block_worker(&p, &gate);
    let batch: Vec<_> = (0..6u64).map(|i| job(move |_| Ok(i))).collect();
    let err = p.submit_many(batch).unwrap_err();
    assert_eq!(err.reason, RejectReason::Full);
    assert_eq!((err.accepted.len(), err.rejected.len()), (3, 3));
    gate.open();
    let res = collect(&p, 4);
    for (i, id) in err.accepted.iter().enumerate() {
        assert_eq!(res[id], Outcome::Completed(i as u64));
    }
    let ids = p
        .submit_many((0..4u64).map(|i| job(move |_| Ok(i))).collect())
        .unwrap();
    assert_eq!(ids.len(), 4);
    p.close(true);
    let res = collect(&p, 4);
    assert!(ids.iter().all(|id| res.contains_key(id)));
    let err = p.submit(job(|_| Ok(0))).unwrap_err();
    assert_eq!(err.reason, RejectReason::Closed);
    let err = p.submit_many(vec![job(|_| Ok(0))]).unwrap_err();
    assert_eq!((err.reason, err.rejected.len()), (RejectReason::Closed, 1));
    assert_eq!(p.stats().workers_alive, 0);
}

#[test]
fn close_without_drain_cancels_everything_and_loses_nothing() {
    let p = pool(2, 128);
    let started = Arc::new(AtomicUsize::new(0));
    let mut ids = Vec::new();
    for _ in 0..2 {
        let s = started.clone();
        ids.push(
            p.submit(job(move |tok| {
                let killed = Arc::new(Gate::default());
                let k = killed.clone();
                let _g = tok.on_cancel(move || k.open());
                s.fetch_add(1, Ordering::SeqCst);
                killed.wait();
                Ok(0)
            }))
            .unwrap(),
        );
    }
    while started.load(Ordering::SeqCst) < 2 {
        std::thread::yield_now();
    }
    for i in 0..50u64 {
        ids.push(p.submit(job(move |_| Ok(i))).unwrap());
    }
    p.close(false);
    let res = collect(&p, ids.len());
    assert!(ids.iter().all(|id| res[id] == Outcome::Cancelled));
    assert!(p.drain(10).is_empty());
    assert_eq!(p.stats().cancelled, 52);
    p.close(false); // idempotent
}

#[test]
fn completion_fd_is_readable_iff_results_pending() {
    let p = pool(1, 16);
    let fd = p.completion_fd();
    assert!(!readable(fd, 0));
    let ids = p
        .submit_many((0..5u64).map(|i| job(move |_| Ok(i))).collect())
        .unwrap();
    assert!(readable(fd, 5000));
    let mut got = Vec::new();
    while got.len() < 5 {
        assert!(readable(fd, 5000));
        got.extend(p.drain(2));
    }
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), ids);
    // Nothing pending: after one drain the fd must not stay readable.
    let _ = p.drain(16);
    assert!(!readable(fd, 20));
}

fn readable(fd: i32, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: valid pollfd array of length 1.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

#[test]
fn stats_report_utilisation_and_rate() {
    let p = pool(2, 64);
    p.submit_many(
        (0..4)
            .map(|_| {
                job(|_| {
                    std::thread::sleep(Duration::from_millis(30));
                    Ok(0)
                })
            })
            .collect(),
    )
    .unwrap();
    let mid = p.stats();
    assert!(mid.running + mid.queued() + mid.pending_results + mid.finished() as usize >= 1);
    collect(&p, 4);
    let st = p.stats();
    assert_eq!(st.completed, 4);
    assert!(st.utilisation > 0.2 && st.utilisation <= 1.0, "{st:?}");
    assert!(st.jobs_per_sec > 0.0);
    assert_eq!(st.running, 0);
}

#[test]
fn capacity_validation() {
    let e = Pool::new(
        Closures,
        Config {
            capacity: 0,
            ..Config::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let p = pool(0, 8);
    assert!(p.workers() >= 1);
}

fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info.to_string();
            if !msg.contains("boom") {
                default(info);
            }
        }));
    });
}

#[test]
fn a_forked_child_refuses_jobs_and_leaves_the_parents_workers_alone() {
    let p = pool(2, 16);
    let id = p.submit(job(|_| Ok(1))).unwrap();
    assert_eq!(collect(&p, 1)[&id], Outcome::Completed(1));
    // SAFETY: the child only submits (refused before any lock or allocation of the pool),
    // closes and drops the pool, which must all return at once, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let refused = matches!(
            p.submit(job(|_| Ok(2))),
            Err(e) if e.reason == RejectReason::Closed
        );
        p.close(true);
        drop(p);
        // SAFETY: ending the forked child without running the parent's destructors.
        unsafe { libc::_exit(if refused { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );
    // The parent's workers still run jobs.
    let id = p.submit(job(|_| Ok(3))).unwrap();
    assert_eq!(collect(&p, 1)[&id], Outcome::Completed(3));
}
