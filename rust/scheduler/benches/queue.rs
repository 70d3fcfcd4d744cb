//! Queue and pool throughput.
//!
//! ```text
//! cargo bench -p agentrl-scheduler --bench queue
//! ```
//!
//! * `queue/<impl>/<threads>`: push+pop pairs per second through a bounded
//!   queue of 1024 slots: this crate's Vyukov queue vs `Mutex<VecDeque>` vs
//!   `crossbeam_channel::bounded`. With 1 thread the thread alternates push
//!   and pop; with N >= 2 threads, N/2 producers and N/2 consumers. All three
//!   use non-blocking try-push/try-pop with the same back-off (spin, then
//!   yield) on full/empty, so only the queue differs. One criterion
//!   "element" = one push + one pop.
//! * `pool/...`: no-op jobs per second through the whole [`Pool`]:
//!   `submit_many` in batches + `drain`, waiting on the completion fd when
//!   there is nothing to drain; or one `submit` per job.

use std::collections::VecDeque;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use agentrl_scheduler::queue::{self, Consumer, Producer};
use agentrl_scheduler::{
    Backpressure, CancelToken, Config, Executor, InfraError, JobId, JobSpec, Outcome, Pool,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const CAP: usize = 1024;

trait BenchQueue: Send + Sync + 'static {
    const NAME: &'static str;
    fn with_capacity(cap: usize) -> Self;
    fn try_push(&self, v: u64) -> bool;
    fn try_pop(&self) -> Option<u64>;
}

struct Vyukov(Producer<u64>, Consumer<u64>);

impl BenchQueue for Vyukov {
    const NAME: &'static str = "vyukov";
    fn with_capacity(cap: usize) -> Self {
        let (p, c) = queue::bounded(cap);
        Vyukov(p, c)
    }
    #[inline]
    fn try_push(&self, v: u64) -> bool {
        self.0.push(v).is_ok()
    }
    #[inline]
    fn try_pop(&self) -> Option<u64> {
        self.1.pop()
    }
}

struct MutexDeque(Mutex<VecDeque<u64>>, usize);

impl BenchQueue for MutexDeque {
    const NAME: &'static str = "mutex_vecdeque";
    fn with_capacity(cap: usize) -> Self {
        MutexDeque(Mutex::new(VecDeque::with_capacity(cap)), cap)
    }
    #[inline]
    fn try_push(&self, v: u64) -> bool {
        let mut q = self.0.lock().unwrap();
        if q.len() < self.1 {
            q.push_back(v);
            true
        } else {
            false
        }
    }
    #[inline]
    fn try_pop(&self) -> Option<u64> {
        self.0.lock().unwrap().pop_front()
    }
}

struct Crossbeam(
    crossbeam_channel::Sender<u64>,
    crossbeam_channel::Receiver<u64>,
);

impl BenchQueue for Crossbeam {
    const NAME: &'static str = "crossbeam_channel";
    fn with_capacity(cap: usize) -> Self {
        let (s, r) = crossbeam_channel::bounded(cap);
        Crossbeam(s, r)
    }
    #[inline]
    fn try_push(&self, v: u64) -> bool {
        self.0.try_send(v).is_ok()
    }
    #[inline]
    fn try_pop(&self) -> Option<u64> {
        self.1.try_recv().ok()
    }
}

/// Spin a little, then yield (identical for all implementations).
#[inline]
fn backoff(step: &mut u32) {
    if *step < 6 {
        for _ in 0..(1 << *step) {
            std::hint::spin_loop();
        }
        *step += 1;
    } else {
        thread::yield_now();
    }
}

/// Moves `n` items through `q` with `threads` threads; returns the wall time
/// from the start barrier to the last join.
fn run_queue<Q: BenchQueue>(threads: usize, n: u64) -> Duration {
    let q = Arc::new(Q::with_capacity(CAP));
    if threads == 1 {
        let start = Instant::now();
        for i in 0..n {
            assert!(q.try_push(i));
            std::hint::black_box(q.try_pop());
        }
        return start.elapsed();
    }
    let pairs = threads / 2;
    let share = |k: usize| n / pairs as u64 + u64::from((k as u64) < n % pairs as u64);
    let barrier = Arc::new(Barrier::new(2 * pairs + 1));
    let mut handles = Vec::with_capacity(2 * pairs);
    for k in 0..pairs {
        let quota = share(k);
        let (qp, b) = (q.clone(), barrier.clone());
        handles.push(thread::spawn(move || {
            b.wait();
            for i in 0..quota {
                let mut step = 0;
                while !qp.try_push(i) {
                    backoff(&mut step);
                }
            }
        }));
        let (q, b) = (q.clone(), barrier.clone());
        handles.push(thread::spawn(move || {
            b.wait();
            let mut sum = 0u64;
            for _ in 0..quota {
                let mut step = 0;
                loop {
                    if let Some(v) = q.try_pop() {
                        sum = sum.wrapping_add(v);
                        break;
                    }
                    backoff(&mut step);
                }
            }
            std::hint::black_box(sum);
        }));
    }
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}

fn bench_one<Q: BenchQueue>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    threads: usize,
) {
    g.bench_with_input(BenchmarkId::new(Q::NAME, threads), &threads, |b, &t| {
        b.iter_custom(|iters| run_queue::<Q>(t, iters));
    });
}

fn queues(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue");
    g.throughput(Throughput::Elements(1));
    for threads in [1, 2, 4, 8] {
        bench_one::<Vyukov>(&mut g, threads);
        bench_one::<MutexDeque>(&mut g, threads);
        bench_one::<Crossbeam>(&mut g, threads);
    }
    g.finish();
}

struct Noop;

impl Executor for Noop {
    type Job = u64;
    type Output = u64;
    #[inline]
    fn execute(&self, job: &u64, _: &CancelToken<'_>) -> Result<u64, InfraError> {
        Ok(*job)
    }
}

const POOL_CAP: usize = 1 << 16;

fn new_pool(workers: usize) -> Pool<Noop> {
    Pool::new(
        Noop,
        Config {
            workers,
            capacity: POOL_CAP,
            retries: 0,
            backpressure: Backpressure::Error,
            ..Config::default()
        },
    )
    .unwrap()
}

/// Pushes `n` no-op jobs through `pool` in batches of `batch`, keeping at
/// most `POOL_CAP / 2` in flight, and drains every result.
fn run_pool(pool: &Pool<Noop>, n: u64, batch: usize) -> Duration {
    let mut buf: Vec<(JobId, Outcome<u64>)> = Vec::with_capacity(POOL_CAP);
    let start = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        let mut progressed = false;
        if sent < n && sent - done + (batch as u64) <= (POOL_CAP / 2) as u64 {
            let k = batch.min((n - sent) as usize);
            let specs: Vec<_> = (sent..sent + k as u64).map(JobSpec::new).collect();
            let ids = pool.submit_many(specs).expect("room for the batch");
            sent += ids.len() as u64;
            progressed = true;
        }
        buf.clear();
        let got = pool.drain_into(&mut buf, usize::MAX);
        done += got as u64;
        if got == 0 && !progressed {
            wait_readable(pool.completion_fd(), 10);
        }
    }
    start.elapsed()
}

fn run_pool_single(pool: &Pool<Noop>, n: u64) -> Duration {
    let mut buf: Vec<(JobId, Outcome<u64>)> = Vec::with_capacity(POOL_CAP);
    let start = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while sent < n && sent - done < (POOL_CAP / 2) as u64 {
            pool.submit(JobSpec::new(sent)).expect("room");
            sent += 1;
            if sent % 1024 == 0 {
                break;
            }
        }
        buf.clear();
        let got = pool.drain_into(&mut buf, usize::MAX);
        done += got as u64;
        if got == 0 && sent == n {
            wait_readable(pool.completion_fd(), 10);
        }
    }
    start.elapsed()
}

fn wait_readable(fd: i32, ms: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd array of length 1.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}

fn pools(c: &mut Criterion) {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let mut g = c.benchmark_group("pool");
    g.throughput(Throughput::Elements(1));
    for (workers, batch) in [(cores, 1024), (cores, 8192), (1, 1024)] {
        let pool = new_pool(workers);
        g.bench_function(format!("submit_many_b{batch}_w{workers}"), |b| {
            b.iter_custom(|iters| run_pool(&pool, iters, batch));
        });
        let st = pool.stats();
        eprintln!(
            "  pool stats (w{workers}, b{batch}): {} jobs, utilisation {:.2}",
            st.completed, st.utilisation
        );
    }
    let pool = new_pool(cores);
    g.bench_function(format!("submit_one_w{cores}"), |b| {
        b.iter_custom(|iters| run_pool_single(&pool, iters));
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = queues, pools
}
criterion_main!(benches);
