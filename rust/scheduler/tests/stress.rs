//! Multi-threaded stress tests: many producers, random cancels, deadlines and
//! a faulty executor. Every test is bounded by timeouts so a deadlock fails
//! instead of hanging.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use agentrl_scheduler::{
    Backpressure, CancelToken, Config, Executor, InfraError, JobId, JobSpec, Outcome, Pool,
    RejectReason,
};

/// xorshift64*: deterministic per-thread randomness without dependencies.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    /// Returns `value`.
    Ok,
    /// Panics.
    Panic,
    /// Infra error on the first `n` attempts, then `value`.
    Flaky(u32),
    /// Always an infra error.
    Broken,
    /// Spins ~`us` microseconds with a kill hook registered, checking the
    /// token; returns `value` unless killed.
    Slow(u64),
}

#[derive(Debug)]
struct Job {
    value: u64,
    behaviour: Behaviour,
}

struct Faulty {
    hooks_fired: Arc<AtomicU64>,
}

impl Executor for Faulty {
    type Job = Job;
    type Output = u64;
    fn execute(&self, job: &Job, cancel: &CancelToken<'_>) -> Result<u64, InfraError> {
        match job.behaviour {
            Behaviour::Ok => Ok(job.value),
            Behaviour::Panic => panic!("stress-panic {}", job.value),
            Behaviour::Flaky(n) if cancel.attempt() < n => Err(InfraError::new("flaky")),
            Behaviour::Flaky(_) => Ok(job.value),
            Behaviour::Broken => Err(InfraError::new("broken")),
            Behaviour::Slow(us) => {
                let killed = Arc::new(AtomicBool::new(false));
                let k = killed.clone();
                let fired = self.hooks_fired.clone();
                let _guard = cancel.on_cancel(move || {
                    fired.fetch_add(1, Ordering::Relaxed);
                    k.store(true, Ordering::Release);
                });
                let end = Instant::now() + Duration::from_micros(us);
                while Instant::now() < end {
                    if killed.load(Ordering::Acquire) {
                        assert!(cancel.is_cancelled());
                        return Ok(u64::MAX); // dropped by the pool: cancelled
                    }
                    std::hint::spin_loop();
                }
                Ok(job.value)
            }
        }
    }
}

fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.to_string().contains("stress-panic") {
                default(info);
            }
        }));
    });
}

/// Per-job record kept by the producers.
#[derive(Clone, Copy, Debug)]
struct Sent {
    value: u64,
    behaviour: Behaviour,
    /// `cancel` returned true for it.
    cancelled: bool,
    has_deadline: bool,
}

/// 8 producers x 10k jobs through 4 workers with a faulty executor, random
/// priorities, groups, deadlines, single and group cancels, and a pool small
/// enough to exercise blocking backpressure.
#[test]
fn eight_producers_faulty_executor_exactly_one_result_each() {
    quiet_panics();
    const PRODUCERS: u64 = 8;
    const PER: u64 = 10_000;
    const WORKERS: usize = 4;
    let hooks_fired = Arc::new(AtomicU64::new(0));
    let pool = Arc::new(
        Pool::new(
            Faulty {
                hooks_fired: hooks_fired.clone(),
            },
            Config {
                workers: WORKERS,
                capacity: 1024,
                retries: 2,
                backpressure: Backpressure::Block(Duration::from_secs(20)),
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let sent: Arc<Mutex<HashMap<JobId, Sent>>> = Arc::new(Mutex::new(HashMap::new()));
    let producers_done = Arc::new(AtomicUsize::new(0));
    let group_cancels = Arc::new(AtomicU64::new(0));
    // Ids of recently submitted jobs, for the chaos canceller.
    let recent: Arc<Vec<AtomicU64>> = Arc::new((0..64).map(|_| AtomicU64::new(0)).collect());

    // Chaos canceller: cancels random recent jobs from its own thread, so
    // that cancels also land on running jobs and race with their start/end.
    let chaos = {
        let pool = pool.clone();
        let recent = recent.clone();
        let producers_done = producers_done.clone();
        thread::spawn(move || {
            let mut rng = Rng::new(99);
            let mut cancelled = Vec::new();
            while producers_done.load(Ordering::SeqCst) < PRODUCERS as usize {
                let id = recent[rng.below(64) as usize].load(Ordering::Relaxed);
                if id != 0 && rng.below(8) == 0 && pool.cancel(JobId(id)) {
                    cancelled.push(JobId(id));
                }
                thread::sleep(Duration::from_micros(20));
            }
            cancelled
        })
    };

    // Consumer: waits on the completion fd and drains in batches.
    let consumer = {
        let pool = pool.clone();
        let producers_done = producers_done.clone();
        thread::spawn(move || {
            let mut results: HashMap<JobId, Outcome<u64>> = HashMap::new();
            let mut buf = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                buf.clear();
                pool.drain_into(&mut buf, 512);
                for (id, o) in buf.drain(..) {
                    assert!(results.insert(id, o).is_none(), "two results for {id:?}");
                }
                let st = pool.stats();
                if producers_done.load(Ordering::SeqCst) == PRODUCERS as usize
                    && results.len() as u64 == st.submitted
                {
                    return results;
                }
                assert!(Instant::now() < deadline, "no progress: {st:?}");
                let mut pfd = libc::pollfd {
                    fd: pool.completion_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: valid pollfd array of length 1.
                unsafe { libc::poll(&mut pfd, 1, 50) };
            }
        })
    };

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let pool = pool.clone();
            let sent = sent.clone();
            let producers_done = producers_done.clone();
            let group_cancels = group_cancels.clone();
            let recent = recent.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(t + 1);
                let mut mine: Vec<(JobId, Sent)> = Vec::with_capacity(PER as usize);
                let mut batch = Vec::new();
                let mut batch_meta = Vec::new();
                for i in 0..PER {
                    let value = t * PER + i;
                    let behaviour = match rng.below(100) {
                        0 => Behaviour::Panic,
                        1..=3 => Behaviour::Flaky(1 + rng.below(2) as u32),
                        4 => Behaviour::Broken,
                        5..=7 => Behaviour::Slow(50 + rng.below(400)),
                        _ => Behaviour::Ok,
                    };
                    let mut spec = JobSpec::new(Job { value, behaviour })
                        .priority(rng.below(9) as i32 - 4)
                        .group(t * 100 + rng.below(50));
                    let has_deadline = rng.below(20) == 0;
                    if has_deadline {
                        // Some already passed, some in the near future.
                        let us = rng.below(2000);
                        spec = spec.deadline(Instant::now() + Duration::from_micros(us));
                    }
                    let meta = Sent {
                        value,
                        behaviour,
                        cancelled: false,
                        has_deadline,
                    };
                    if rng.below(4) == 0 {
                        // Batched submission.
                        batch.push(spec);
                        batch_meta.push(meta);
                        if batch.len() == 32 {
                            let ids = pool
                                .submit_many(std::mem::take(&mut batch))
                                .expect("batch accepted");
                            mine.extend(ids.into_iter().zip(batch_meta.drain(..)));
                        }
                    } else {
                        let id = pool
                            .submit(spec)
                            .expect("accepted within the block timeout");
                        if matches!(behaviour, Behaviour::Slow(_)) || i % 8 == 0 {
                            recent[(i % 64) as usize].store(id.as_u64(), Ordering::Relaxed);
                        }
                        mine.push((id, meta));
                    }
                    // Random cancels of recent jobs (queued, running or done).
                    if rng.below(10) == 0 && !mine.is_empty() {
                        let back = rng.below(mine.len().min(64) as u64) as usize;
                        let k = mine.len() - 1 - back;
                        if pool.cancel(mine[k].0) {
                            assert!(!mine[k].1.cancelled, "cancelled twice");
                            mine[k].1.cancelled = true;
                        }
                    }
                    if rng.below(2000) == 0 {
                        let n = pool.cancel_group(t * 100 + rng.below(50));
                        group_cancels.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
                if !batch.is_empty() {
                    let ids = pool.submit_many(batch).expect("batch accepted");
                    mine.extend(ids.into_iter().zip(batch_meta));
                }
                let mut s = sent.lock().unwrap();
                for (id, meta) in mine {
                    assert!(s.insert(id, meta).is_none(), "id {id:?} handed out twice");
                }
                drop(s);
                producers_done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let results = consumer.join().unwrap();
    let chaos_cancelled = chaos.join().unwrap();
    let mut sent = sent.lock().unwrap();
    for id in &chaos_cancelled {
        let meta = sent.get_mut(id).expect("chaos cancelled a known job");
        assert!(!meta.cancelled, "cancel() returned true twice for {id:?}");
        meta.cancelled = true;
    }
    assert_eq!(sent.len() as u64, PRODUCERS * PER);
    assert_eq!(
        results.len(),
        sent.len(),
        "every job has exactly one result"
    );

    let mut by_kind = [0u64; 4];
    for (id, meta) in sent.iter() {
        let outcome = results
            .get(id)
            .unwrap_or_else(|| panic!("no result for {id:?}"));
        match outcome {
            Outcome::Completed(v) => {
                by_kind[0] += 1;
                assert!(!meta.cancelled, "{meta:?} cancel() said true but completed");
                assert_eq!(*v, meta.value);
                assert!(matches!(
                    meta.behaviour,
                    Behaviour::Ok | Behaviour::Flaky(_) | Behaviour::Slow(_)
                ));
            }
            Outcome::Cancelled => by_kind[1] += 1,
            Outcome::Expired => {
                by_kind[2] += 1;
                assert!(meta.has_deadline);
                assert!(!meta.cancelled);
            }
            Outcome::Failed(msg) => {
                by_kind[3] += 1;
                assert!(!meta.cancelled);
                match meta.behaviour {
                    Behaviour::Panic => assert!(msg.starts_with("executor panicked: stress-panic")),
                    Behaviour::Broken => {
                        assert!(msg.contains("3 attempt") && msg.contains("broken"))
                    }
                    b => panic!("{b:?} failed: {msg}"),
                }
            }
        }
        if meta.cancelled {
            assert_eq!(*outcome, Outcome::Cancelled);
        }
        if meta.behaviour == Behaviour::Panic && !meta.cancelled {
            assert!(matches!(
                outcome,
                Outcome::Failed(_) | Outcome::Expired | Outcome::Cancelled
            ));
        }
    }

    let st = pool.stats();
    assert_eq!(st.submitted, PRODUCERS * PER);
    assert_eq!(
        [st.completed, st.cancelled, st.expired, st.failed],
        by_kind,
        "stats agree with the results: {st:?}"
    );
    assert_eq!(st.finished(), PRODUCERS * PER);
    assert_eq!(st.pending_results, 0);
    assert_eq!(st.running, 0);
    assert_eq!(
        st.workers_alive, WORKERS,
        "pool size unchanged after panics"
    );
    assert!(st.panics > 0 && st.retries > 0);
    let single_cancels = sent.values().filter(|m| m.cancelled).count() as u64;
    let slow_cancelled = sent
        .iter()
        .filter(|(id, m)| {
            matches!(m.behaviour, Behaviour::Slow(_)) && results[*id] == Outcome::Cancelled
        })
        .count();
    assert!(by_kind[1] >= single_cancels + group_cancels.load(Ordering::Relaxed));
    eprintln!(
        "stress: {} jobs, completed {} cancelled {} (cancel() true: {}, by group: {}, slow jobs: {}, hooks fired: {}) \
         expired {} failed {} (panics {}), retries {}, utilisation {:.2}, {:.0} jobs/s",
        sent.len(),
        by_kind[0],
        by_kind[1],
        single_cancels,
        group_cancels.load(Ordering::Relaxed),
        slow_cancelled,
        hooks_fired.load(Ordering::Relaxed),
        by_kind[2],
        by_kind[3],
        st.panics,
        st.retries,
        st.utilisation,
        st.jobs_per_sec
    );
    pool.close(true);
    assert_eq!(pool.stats().workers_alive, 0);
}

/// A cancel issued while the job may be starting: `cancel() == true` exactly
/// when the outcome is `Cancelled`.
#[test]
fn cancel_races_start() {
    struct Noop;
    impl Executor for Noop {
        type Job = u64;
        type Output = u64;
        fn execute(&self, job: &u64, _: &CancelToken<'_>) -> Result<u64, InfraError> {
            Ok(*job)
        }
    }
    let pool = Arc::new(
        Pool::new(
            Noop,
            Config {
                workers: 2,
                capacity: 64,
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel::<JobId>();
    let canceller = {
        let pool = pool.clone();
        thread::spawn(move || {
            let mut cancelled = Vec::new();
            for id in rx {
                if pool.cancel(id) {
                    cancelled.push(id);
                }
            }
            cancelled
        })
    };
    let mut outcomes = HashMap::new();
    for i in 0..20_000u64 {
        let id = loop {
            match pool.submit(JobSpec::new(i)) {
                Ok(id) => break id,
                Err(e) => {
                    // Full: make room by draining (we are the consumer).
                    assert_eq!(e.reason, RejectReason::Full);
                    if let Some((id, o)) = pool.wait_result(Duration::from_millis(100)) {
                        assert!(outcomes.insert(id, o).is_none());
                    }
                }
            }
        };
        tx.send(id).unwrap();
        if i % 32 == 31 {
            for (id, o) in pool.drain(usize::MAX) {
                assert!(outcomes.insert(id, o).is_none());
            }
        }
    }
    drop(tx);
    let cancelled = canceller.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while outcomes.len() < 20_000 {
        assert!(Instant::now() < deadline, "missing results");
        if let Some((id, o)) = pool.wait_result(Duration::from_millis(100)) {
            assert!(outcomes.insert(id, o).is_none());
        }
    }
    let n_cancelled = outcomes
        .values()
        .filter(|o| **o == Outcome::Cancelled)
        .count();
    assert_eq!(n_cancelled, cancelled.len());
    for id in &cancelled {
        assert_eq!(outcomes[id], Outcome::Cancelled);
    }
    eprintln!("cancel race: {} of 20000 cancelled", cancelled.len());
}

/// `close` racing with submitters: accepted jobs all get one result, refused
/// ones come back as `Closed`.
#[test]
fn close_races_submitters() {
    struct Tiny;
    impl Executor for Tiny {
        type Job = u64;
        type Output = u64;
        fn execute(&self, job: &u64, _: &CancelToken<'_>) -> Result<u64, InfraError> {
            Ok(*job)
        }
    }
    for round in 0..20u64 {
        let pool = Arc::new(
            Pool::new(
                Tiny,
                Config {
                    workers: 2,
                    capacity: 256,
                    backpressure: Backpressure::Block(Duration::from_secs(10)),
                    ..Config::default()
                },
            )
            .unwrap(),
        );
        let drain_mode = round % 2 == 0;
        let consumer = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut got = HashMap::new();
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    for (id, o) in pool.drain(usize::MAX) {
                        assert!(got.insert(id, o).is_none());
                    }
                    let st = pool.stats();
                    if pool.is_closed() && st.workers_alive == 0 && got.len() as u64 == st.submitted
                    {
                        return got;
                    }
                    assert!(Instant::now() < deadline);
                    thread::sleep(Duration::from_micros(200));
                }
            })
        };
        let submitters: Vec<_> = (0..3u64)
            .map(|t| {
                let pool = pool.clone();
                thread::spawn(move || {
                    let mut accepted = Vec::new();
                    for i in 0.. {
                        let r = if i % 3 == 0 {
                            pool.submit_many(vec![JobSpec::new(i), JobSpec::new(i + 1)])
                                .map_err(|e| {
                                    accepted.extend(e.accepted);
                                    e.reason
                                })
                        } else {
                            pool.submit(JobSpec::new(t))
                                .map(|id| vec![id])
                                .map_err(|e| e.reason)
                        };
                        match r {
                            Ok(ids) => accepted.extend(ids),
                            Err(reason) => {
                                assert_eq!(reason, RejectReason::Closed);
                                return accepted;
                            }
                        }
                    }
                    unreachable!()
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(2 + round % 5));
        pool.close(drain_mode);
        let accepted: Vec<JobId> = submitters
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let got = consumer.join().unwrap();
        assert_eq!(got.len(), accepted.len());
        for id in &accepted {
            let o = &got[id];
            if drain_mode {
                assert!(matches!(o, Outcome::Completed(_)), "{o:?}");
            } else {
                assert!(
                    matches!(o, Outcome::Completed(_) | Outcome::Cancelled),
                    "{o:?}"
                );
            }
        }
    }
}

/// Kill hooks under load: a canceller thread cancels jobs right after they
/// start. A hook fires at most once, only for a job whose `cancel` returned
/// true, and such a job always ends `Cancelled`.
#[test]
fn kill_hooks_fire_once_for_cancelled_running_jobs() {
    const N: usize = 2000;
    struct Spinner {
        started: Arc<Vec<AtomicBool>>,
        fired: Arc<Vec<AtomicU64>>,
    }
    impl Executor for Spinner {
        type Job = (usize, u64);
        type Output = u64;
        fn execute(&self, job: &(usize, u64), tok: &CancelToken<'_>) -> Result<u64, InfraError> {
            let (idx, us) = *job;
            let killed = Arc::new(AtomicBool::new(false));
            let (k, fired) = (killed.clone(), self.fired.clone());
            let _guard = tok.on_cancel(move || {
                fired[idx].fetch_add(1, Ordering::SeqCst);
                k.store(true, Ordering::SeqCst);
            });
            self.started[idx].store(true, Ordering::SeqCst);
            let end = Instant::now() + Duration::from_micros(us);
            while Instant::now() < end && !killed.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
            Ok(idx as u64)
        }
    }
    let started: Arc<Vec<AtomicBool>> = Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
    let fired: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
    let pool = Arc::new(
        Pool::new(
            Spinner {
                started: started.clone(),
                fired: fired.clone(),
            },
            Config {
                workers: 2,
                capacity: N,
                ..Config::default()
            },
        )
        .unwrap(),
    );
    let mut rng = Rng::new(7);
    let specs = (0..N).map(|i| JobSpec::new((i, rng.below(300)))).collect();
    let ids = pool.submit_many(specs).unwrap();
    let canceller = {
        let (pool, ids, started) = (pool.clone(), ids.clone(), started.clone());
        thread::spawn(move || {
            let mut rng = Rng::new(8);
            let mut cancelled = vec![false; N];
            for (i, id) in ids.iter().enumerate() {
                if rng.below(2) == 0 {
                    continue;
                }
                let t0 = Instant::now();
                while !started[i].load(Ordering::SeqCst) && t0.elapsed() < Duration::from_millis(5)
                {
                    std::hint::spin_loop();
                }
                cancelled[i] = pool.cancel(*id);
            }
            cancelled
        })
    };
    let mut outcomes = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while outcomes.len() < N {
        assert!(Instant::now() < deadline, "missing results");
        for (id, o) in pool.drain(usize::MAX) {
            assert!(outcomes.insert(id, o).is_none());
        }
        pool.wait_result(Duration::ZERO)
            .map(|(id, o)| outcomes.insert(id, o));
        thread::sleep(Duration::from_micros(500));
    }
    let cancelled = canceller.join().unwrap();
    let mut hooks = 0;
    for (i, id) in ids.iter().enumerate() {
        let f = fired[i].load(Ordering::SeqCst);
        assert!(f <= 1, "hook fired {f} times");
        if f == 1 {
            hooks += 1;
            assert!(cancelled[i], "hook fired without a successful cancel");
        }
        if cancelled[i] {
            assert_eq!(outcomes[id], Outcome::Cancelled);
        } else {
            assert_eq!(outcomes[id], Outcome::Completed(i as u64));
        }
    }
    let n_cancelled = cancelled.iter().filter(|c| **c).count();
    eprintln!("kill hooks: {n_cancelled} cancelled, {hooks} hooks fired");
    assert!(hooks > 0);
}
