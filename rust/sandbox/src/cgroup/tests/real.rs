//! The real cgroup file system (root only; `AGENTRL_SKIP_CGROUP_TESTS` skips them).

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::get;
use crate::cgroup::dirs::remove_tree;
use crate::cgroup::files::try_lock_dir;
use crate::cgroup::{Manager, Slot, Version, DEFAULT_ROOT, PIDS, V1_CONTROLLERS, V1_UNLIMITED};

/// Moves `pid` into each cgroup of `dirs` (their `cgroup.procs`).
fn move_into(dirs: &[PathBuf], pid: libc::pid_t) -> Result<(), String> {
    for d in dirs {
        fs::write(d.join("cgroup.procs"), pid.to_string())
            .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    Ok(())
}

fn real_manager() -> Option<Manager> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || std::env::var_os("AGENTRL_SKIP_CGROUP_TESTS").is_some() {
        eprintln!("skipping: real cgroup tests need root");
        return None;
    }
    Some(Manager::new(None).expect("cgroup manager on this host"))
}

/// Forks a child that waits until it has been attached to `slot`, then runs `body` and
/// exits with its result. `body` runs in a fork of a multi-threaded process, so it may only
/// use async-signal-safe calls (no allocation).
fn spawn_in(slot: &Slot, body: fn() -> i32) -> libc::pid_t {
    spawn_with(|pid| slot.attach(pid).map_err(|e| e.to_string()), body)
}

/// [`spawn_in`], the child attached by `attach` (given its pid) instead.
fn spawn_with(
    attach: impl FnOnce(libc::pid_t) -> Result<(), String>,
    body: fn() -> i32,
) -> libc::pid_t {
    let mut p = [0; 2];
    // SAFETY: `p` is a valid array of two ints for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child only performs async-signal-safe calls before `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut b = 0u8;
        // SAFETY: plain fd and buffer syscalls in the child; `b` is a valid 1-byte buffer.
        unsafe {
            libc::close(p[1]);
            while libc::read(p[0], (&mut b as *mut u8).cast(), 1) < 0 {}
            libc::_exit(body());
        }
    }
    let attached = attach(pid);
    // SAFETY: writing one byte from a valid buffer to our pipe, then closing our fds.
    unsafe {
        libc::close(p[0]);
        if attached.is_err() {
            libc::kill(pid, libc::SIGKILL);
        }
        libc::write(p[1], b"x".as_ptr().cast(), 1);
        libc::close(p[1]);
    }
    attached.unwrap();
    pid
}

/// Waits for `pid`; returns `Ok(exit code)` or `Err(signal)`.
fn wait(pid: libc::pid_t) -> Result<i32, i32> {
    let mut status = 0;
    // SAFETY: `status` is a valid int for waitpid to fill.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(libc::WTERMSIG(status))
    }
}

fn touch(bytes: usize) -> i32 {
    // SAFETY: a fresh private anonymous mapping; every write below stays inside it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return 2;
        }
        let mut off = 0;
        while off < bytes {
            p.cast::<u8>().add(off).write_volatile(1);
            off += 4096;
        }
    }
    0
}

fn touch_5mb() -> i32 {
    touch(5 << 20)
}
fn touch_50mb() -> i32 {
    touch(50 << 20)
}
fn touch_100mb() -> i32 {
    touch(100 << 20)
}

fn spin_200ms_cpu() -> i32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        // SAFETY: `ts` is a valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        if ts.tv_sec * 1_000_000_000 + ts.tv_nsec >= 200_000_000 {
            return 0;
        }
    }
}

fn sleep_long() -> i32 {
    let ts = libc::timespec {
        tv_sec: 30,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec; the remainder pointer may be null.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    0
}

/// Forks sleeping grandchildren until fork fails; kills and reaps them; exits with how
/// many forks succeeded.
fn fork_until_fail() -> i32 {
    let mut kids = [0 as libc::pid_t; 16];
    let mut n = 0;
    while n < kids.len() {
        // SAFETY: the grandchild only sleeps and exits.
        let k = unsafe { libc::fork() };
        if k == 0 {
            sleep_long();
            // SAFETY: _exit has no preconditions.
            unsafe { libc::_exit(0) };
        }
        if k < 0 {
            break;
        }
        kids[n] = k;
        n += 1;
    }
    for &k in &kids[..n] {
        // SAFETY: signalling and reaping our own children.
        unsafe {
            libc::kill(k, libc::SIGKILL);
            libc::waitpid(k, std::ptr::null_mut(), 0);
        }
    }
    n as i32
}

#[test]
fn real_slots_exist_and_drop_removes_everything() {
    let Some(m) = real_manager() else { return };
    let a = m.create_slot(0).unwrap();
    let b = m.create_slot(1).unwrap();
    let mut all: Vec<PathBuf> = m.base_dirs().to_vec();
    for s in [&a, &b] {
        let n = if m.version() == Version::V1 { 3 } else { 1 };
        assert_eq!(s.paths().len(), n);
        for p in s.paths() {
            assert!(p.join("cgroup.procs").is_file(), "{}", p.display());
        }
        all.extend_from_slice(s.paths());
    }
    if m.version() == Version::V1 {
        for (i, c) in V1_CONTROLLERS.into_iter().enumerate() {
            let p = &a.paths()[i];
            assert!(
                p.starts_with(Path::new(DEFAULT_ROOT).join(c)),
                "{}",
                p.display()
            );
        }
        assert!(a.paths()[0].join("memory.limit_in_bytes").is_file());
        assert!(a.paths()[1].join("pids.max").is_file());
        assert!(a.paths()[2].join("cpuacct.usage").is_file());
    }
    drop(a);
    drop(m); // b keeps the base alive
    assert!(b.paths()[0].exists());
    drop(b);
    for p in &all {
        assert!(!p.exists(), "{} still exists", p.display());
    }
}

#[test]
fn real_limits_are_written() {
    let Some(m) = real_manager() else { return };
    let mut s = m.create_slot(0).unwrap();
    let (mem_file, pids_dir) = match m.version() {
        Version::V1 => (
            s.paths()[0].join("memory.limit_in_bytes"),
            s.paths()[1].clone(),
        ),
        Version::V2 => (s.paths()[0].join("memory.max"), s.paths()[0].clone()),
    };
    for mb in [64u64, 128, 32, 32] {
        s.set_limits(Some(mb << 20), Some(10)).unwrap();
        assert_eq!(get(&mem_file).trim(), (mb << 20).to_string());
        if m.version() == Version::V1 && s.has_memsw {
            let sw = s.paths()[0].join("memory.memsw.limit_in_bytes");
            assert_eq!(get(&sw).trim(), (mb << 20).to_string());
        }
    }
    assert_eq!(get(&pids_dir.join("pids.max")).trim(), "10");
    s.set_limits(None, None).unwrap();
    assert_eq!(get(&pids_dir.join("pids.max")).trim(), "max");
    let unlimited = get(&mem_file);
    assert!(
        unlimited == "max\n" || unlimited == V1_UNLIMITED,
        "{unlimited}"
    );
    // Stale cache (e.g. after an error): the EINVAL fallback still finds the order.
    s.set_limits(Some(16 << 20), None).unwrap();
    s.mem_limit = Some(None);
    s.set_limits(Some(48 << 20), None).unwrap();
    assert_eq!(get(&mem_file).trim(), (48u64 << 20).to_string());
}

#[test]
fn real_peak_memory() {
    let Some(m) = real_manager() else { return };
    let mut s = m.create_slot(0).unwrap();
    s.prepare_run().unwrap();
    let pid = spawn_in(&s, touch_50mb);
    assert_eq!(wait(pid), Ok(0));
    let u = s.usage().unwrap();
    let peak = u.peak_memory_bytes.expect("peak");
    assert!(peak >= 50 << 20, "peak {peak}");
    assert!(u.peak_memory_exact && !u.oom_killed && !u.pids_limit_hit);
    // The next run starts from a reset watermark.
    s.prepare_run().unwrap();
    let pid = spawn_in(&s, touch_5mb);
    assert_eq!(wait(pid), Ok(0));
    let peak = s.usage().unwrap().peak_memory_bytes.expect("peak");
    assert!(peak < 40 << 20, "peak after reset {peak}");
}

#[test]
fn real_oom_kill_is_per_run() {
    let Some(m) = real_manager() else { return };
    let mut s = m.create_slot(0).unwrap();
    s.set_limits(Some(20 << 20), None).unwrap();
    s.prepare_run().unwrap();
    let pid = spawn_in(&s, touch_100mb);
    assert_eq!(wait(pid), Err(libc::SIGKILL));
    let u = s.usage().unwrap();
    assert!(u.oom_killed, "{u:?}");
    assert!(u.peak_memory_bytes.unwrap() <= 21 << 20, "{u:?}");
    s.prepare_run().unwrap();
    let pid = spawn_in(&s, touch_5mb);
    assert_eq!(wait(pid), Ok(0));
    let u = s.usage().unwrap();
    assert!(!u.oom_killed, "{u:?}");
}

#[test]
fn real_cpu_time() {
    let Some(m) = real_manager() else { return };
    let mut s = m.create_slot(0).unwrap();
    s.prepare_run().unwrap();
    let pid = spawn_in(&s, spin_200ms_cpu);
    assert_eq!(wait(pid), Ok(0));
    let cpu = s.cpu_time_ns().unwrap();
    assert!(cpu >= 150_000_000, "cpu {cpu}");
    assert!(cpu < 2_000_000_000, "cpu {cpu}");
    assert_eq!(s.usage().unwrap().cpu_time_ns, cpu);
    s.prepare_run().unwrap();
    assert!(s.cpu_time_ns().unwrap() < 10_000_000);
}

#[test]
fn real_pids_limit() {
    let Some(m) = real_manager() else { return };
    let mut s = m.create_slot(0).unwrap();
    s.set_limits(None, Some(5)).unwrap();
    s.prepare_run().unwrap();
    let pid = spawn_in(&s, fork_until_fail);
    // The child plus 4 forks make 5 processes; the 6th fork fails.
    assert_eq!(wait(pid), Ok(4));
    let u = s.usage().unwrap();
    assert!(u.pids_limit_hit, "{u:?}");
    s.prepare_run().unwrap();
    assert!(!s.usage().unwrap().pids_limit_hit);
}

#[test]
fn real_kill_all() {
    let Some(m) = real_manager() else { return };
    let s = m.create_slot(0).unwrap();
    let pids: Vec<_> = (0..3).map(|_| spawn_in(&s, sleep_long)).collect();
    assert_eq!(s.process_count().unwrap(), 3);
    assert_eq!(s.kill_all().unwrap(), 3);
    assert_eq!(s.process_count().unwrap(), 0);
    for p in pids {
        assert_eq!(wait(p), Err(libc::SIGKILL));
    }
    assert_eq!(s.kill_all().unwrap(), 0);
}

/// Moves the calling thread into the slot (v1 `tasks`) or back to its own cgroups, as the
/// sandbox's supervisor thread does on v1.
fn move_this_thread(slot: &Slot, back: bool) {
    let tid = crate::sys::gettid();
    for d in slot.paths() {
        let target = if back {
            d.parent().unwrap().parent().unwrap()
        } else {
            d
        };
        fs::write(target.join("tasks"), tid.to_string()).unwrap();
    }
}

#[test]
fn real_kill_all_with_our_own_thread_inside() {
    let Some(m) = real_manager() else { return };
    if m.version() != Version::V1 {
        return; // v2 forbids a thread in another cgroup than its process
    }
    let s = m.create_slot(0).unwrap();
    move_this_thread(&s, false);
    let pid = spawn_in(&s, sleep_long);
    let inside = s.list_procs(s.ctl[PIDS]).map(|(_, has_self)| has_self);
    let t = Instant::now();
    let count = s.process_count();
    let killed = s.kill_all();
    let after = s.process_count();
    let took = t.elapsed();
    move_this_thread(&s, true);
    assert!(inside.unwrap(), "our pid should be listed in cgroup.procs");
    assert_eq!(count.unwrap(), 1);
    assert_eq!(killed.unwrap(), 1);
    assert_eq!(after.unwrap(), 0);
    assert!(took < Duration::from_millis(500), "{took:?}");
    assert_eq!(wait(pid), Err(libc::SIGKILL));
    let dirs = s.paths().to_vec();
    drop(s);
    assert!(dirs.iter().all(|d| !d.exists()));
}

#[test]
fn real_drop_kills_leftovers() {
    let Some(m) = real_manager() else { return };
    let s = m.create_slot(0).unwrap();
    let pid = spawn_in(&s, sleep_long);
    let dirs = s.paths().to_vec();
    drop(s);
    assert_eq!(wait(pid), Err(libc::SIGKILL));
    for d in dirs {
        assert!(!d.exists(), "{}", d.display());
    }
}

/// Sets a directory's modification time `secs` seconds into the past.
fn backdate(d: &Path, secs: i64) {
    let c = std::ffi::CString::new(d.as_os_str().as_bytes()).unwrap();
    let mut now = std::mem::MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: clock_gettime fills the timespec it is given.
    let now = unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, now.as_mut_ptr());
        now.assume_init()
    };
    let then = libc::timespec {
        tv_sec: now.tv_sec - secs,
        tv_nsec: 0,
    };
    let times = [then, then];
    // SAFETY: NUL-terminated path and two valid timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat {}", d.display());
}

#[test]
fn real_stale_bases_are_reaped_locked_and_young_ones_kept() {
    let Some(m) = real_manager() else { return };
    // Next to our base, in every hierarchy: bases whose owner pid cannot exist (far above
    // pid_max), each with a slot below: one stale, one still locked (its owner alive in
    // another pid namespace, say), one just made.
    let tag = std::process::id();
    let make = |n: u32| -> Vec<PathBuf> {
        m.parents
            .iter()
            .map(|p| {
                let d = p.join(format!("agentrl-2147483600-{tag}{n}"));
                fs::create_dir(&d).unwrap();
                fs::create_dir(d.join("slot-0")).unwrap();
                d
            })
            .collect()
    };
    let stale = make(1);
    let held = make(2);
    let young = make(3);
    for d in stale.iter().chain(&held) {
        backdate(d, 3600);
    }
    let locks: Vec<OwnedFd> = held
        .iter()
        .map(|d| try_lock_dir(d).unwrap().expect("lock"))
        .collect();
    // A new manager reaps what is stale, and only that.
    let m2 = Manager::new(None).unwrap();
    for d in &stale {
        assert!(!d.exists(), "{} should be gone", d.display());
    }
    for d in held.iter().chain(&young) {
        assert!(d.join("slot-0").exists(), "{} should stay", d.display());
    }
    // Live managers' own bases are locked, so a reaper in another pid namespace (where
    // our pid looks dead) leaves them alone.
    for d in m.base_dirs().iter().chain(m2.base_dirs()) {
        assert!(try_lock_dir(d).unwrap().is_none(), "{}", d.display());
    }
    drop(locks);
    for d in held.iter().chain(&young) {
        assert!(remove_tree(d, false, false));
    }
}

/// The nsjail backend's mode on the real host: an OOM in nsjail's child cgroup is counted by
/// the run even once that child is gone (v1: through the eventfd), and the kill spares
/// nsjail, which sits in the run's v1 cpuacct cgroup, while it takes the jail below.
#[test]
fn real_nsjail_run_counts_an_oom_below_it_and_spares_nsjail() {
    if real_manager().is_none() {
        return;
    }
    let m = Manager::for_nsjail(None).unwrap();
    let mut run = m.create_jail_run(0).unwrap();
    run.set_limits(32 << 20, 64).unwrap();
    let v1 = run.version() == Version::V1;
    // nsjail's child cgroup: in the memory and pids hierarchies (v1), below the run (v2); the
    // jail's CPU time stays in the run's own v1 cpuacct cgroup, nsjail's.
    let jail_dirs = |name: &str| -> Vec<PathBuf> {
        let mut ds: Vec<PathBuf> = if v1 {
            vec!["memory", "pids"]
        } else {
            vec!["memory"]
        }
        .into_iter()
        .map(|c| run.dir(c).unwrap().join(name))
        .collect();
        ds.iter().for_each(|d| fs::create_dir(d).unwrap());
        if v1 {
            ds.push(run.dir("cpuacct").unwrap().to_path_buf());
        }
        ds
    };

    let oom_dirs = jail_dirs("NSJAIL.oom");
    let victim = spawn_with(|pid| move_into(&oom_dirs, pid), touch_100mb);
    assert_eq!(wait(victim), Err(libc::SIGKILL));
    for d in oom_dirs.iter().filter(|d| d.ends_with("NSJAIL.oom")) {
        fs::remove_dir(d).unwrap(); // as nsjail does once the jail is gone
    }
    let u = run.usage();
    assert!(u.oom_kill.is_some_and(|n| n >= 1), "{u:?}");
    assert!(u.peak.is_some_and(|p| p >= 30 << 20), "{u:?}");

    let nsjail_dirs = [run.dir("cpuacct").unwrap().to_path_buf()];
    let nsjail = v1.then(|| spawn_with(|pid| move_into(&nsjail_dirs, pid), sleep_long));
    let jail_dirs = jail_dirs("NSJAIL.kill");
    let jail = spawn_with(|pid| move_into(&jail_dirs, pid), sleep_long);
    assert_eq!(run.kill_except(nsjail.unwrap_or(0)), 1);
    assert_eq!(wait(jail), Err(libc::SIGKILL));
    if let Some(nsjail) = nsjail {
        // SAFETY: kill(2) with signal 0 only checks for existence.
        assert_eq!(unsafe { libc::kill(nsjail, 0) }, 0, "nsjail was spared");
        // SAFETY: kill(2) takes plain integers; `nsjail` is our own child.
        unsafe { libc::kill(nsjail, libc::SIGKILL) };
        assert_eq!(wait(nsjail), Err(libc::SIGKILL));
    }
    // nsjail's child cgroup left behind (nsjail killed) goes with the run.
    let dirs: Vec<PathBuf> = ["memory", "pids", "cpuacct"]
        .map(|c| run.dir(c).unwrap().to_path_buf())
        .to_vec();
    run.remove().unwrap();
    assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
}
