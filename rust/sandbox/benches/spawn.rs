//! A cold `/bin/true` through the sandbox against what the kernel alone charges for it.
//!
//! ```text
//! cargo bench -p agentrl-sandbox --bench spawn
//! ```
//!
//! Needs root (the floors create namespaces without a user namespace). Each group times one
//! run of `/bin/true`, exec to exit and reaped, three ways in the same process:
//!
//! * `floor/exec`: `clone(CLONE_VM | CLONE_VFORK)` + `execve`, no isolation at all: the least
//!   any spawner pays (for a dynamically linked `/bin/true`, the loader's start-up is in it).
//! * `floor/namespaces`: the same with fresh pid, mount, ipc and uts namespaces: the kernel's
//!   part of an isolated run, with no user namespace, no new root, no seccomp, no limits and
//!   no supervision.
//! * `agentrl/run`: [`Sandbox::run`], the whole box (user namespace, pivot into the read-only
//!   root, fresh tmpfs and `/proc`, cgroup, rlimits, seccomp, captured output, a verdict).
//!
//! `latency` runs one at a time; `saturated` runs from 8 threads at once and reports the time
//! per run (its inverse is runs per second on this machine's cores).

use std::ffi::CString;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use agentrl_sandbox::{RunRequest, Sandbox, SandboxConfig, Status};
use criterion::{criterion_group, criterion_main, Criterion};

const THREADS: usize = 8;
const STACK: usize = 64 << 10;

/// One `/bin/true` by `clone` + `execve` with `flags` added, reaped.
struct Floor {
    flags: libc::c_int,
    path: CString,
    argv: [*const libc::c_char; 2],
    envp: [*const libc::c_char; 1],
}

// SAFETY: the pointers in argv point into `path`, which the struct owns and never changes; the
// struct is only read while spawning.
unsafe impl Send for Floor {}
// SAFETY: as above: shared references only read it.
unsafe impl Sync for Floor {}

extern "C" fn floor_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the Floor passed by `spawn`, alive until the child has exec'd (vfork).
    let f = unsafe { &*(arg as *const Floor) };
    // SAFETY: NUL-terminated path and NULL-terminated arrays owned by the Floor.
    unsafe {
        libc::execve(f.path.as_ptr(), f.argv.as_ptr(), f.envp.as_ptr());
        libc::_exit(127)
    }
}

impl Floor {
    fn new(flags: libc::c_int) -> Box<Floor> {
        let path = CString::new("/bin/true").unwrap();
        let mut f = Box::new(Floor {
            flags,
            path,
            argv: [std::ptr::null(); 2],
            envp: [std::ptr::null()],
        });
        f.argv[0] = f.path.as_ptr();
        f
    }

    fn spawn(&self, stack: &mut [u8]) {
        let top = stack.as_mut_ptr_range().end as *mut libc::c_void;
        // SAFETY: the child runs on `stack`, which outlives it (CLONE_VFORK: we resume after
        // its execve), and only calls execve/_exit.
        let pid = unsafe {
            libc::clone(
                floor_child,
                top,
                self.flags | libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                self as *const Floor as *mut libc::c_void,
            )
        };
        assert!(pid > 0, "clone: {}", std::io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(r == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}

fn true_request() -> RunRequest {
    RunRequest {
        argv: vec![b"/bin/true".to_vec()],
        ..Default::default()
    }
}

fn run_box(sb: &Sandbox) {
    let r = sb.run(true_request()).expect("run");
    assert_eq!(r.status, Status::Ok, "{r:?}");
}

/// Time per run with `THREADS` threads each doing `iters / THREADS` (at least one) runs;
/// `one` gets the thread's own child stack.
fn saturated<F: Fn(&mut [u8]) + Sync>(iters: u64, one: F) -> Duration {
    let per = (iters as usize).div_ceil(THREADS).max(1);
    let barrier = Barrier::new(THREADS + 1);
    let elapsed = thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut stack = vec![0u8; STACK];
                barrier.wait();
                for _ in 0..per {
                    one(&mut stack);
                }
            });
        }
        barrier.wait();
        let t0 = Instant::now();
        // The scope joins every thread before returning.
        t0
    })
    .elapsed();
    elapsed.mul_f64(iters as f64 / (per * THREADS) as f64)
}

fn bench(c: &mut Criterion) {
    let ns = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    let floors = [
        ("floor/exec", Floor::new(0)),
        ("floor/namespaces", Floor::new(ns)),
    ];
    let sb = Arc::new(
        Sandbox::new(SandboxConfig {
            max_concurrency: THREADS,
            ..Default::default()
        })
        .expect("sandbox set-up (needs root)"),
    );
    for _ in 0..2 * THREADS {
        run_box(&sb);
    }

    let mut g = c.benchmark_group("cold /bin/true latency");
    g.sample_size(30).measurement_time(Duration::from_secs(6));
    for (name, f) in &floors {
        let mut stack = vec![0u8; STACK];
        g.bench_function(*name, |b| b.iter(|| f.spawn(&mut stack)));
    }
    g.bench_function("agentrl/run", |b| b.iter(|| run_box(&sb)));
    g.finish();

    let mut g = c.benchmark_group("cold /bin/true saturated (time per run, 8 threads)");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for (name, f) in &floors {
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| saturated(iters, |stack| f.spawn(stack)))
        });
    }
    g.bench_function("agentrl/run", |b| {
        b.iter_custom(|iters| saturated(iters, |_| run_box(&sb)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
