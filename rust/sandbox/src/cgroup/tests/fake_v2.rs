//! Fake v2 trees: where the base goes, controllers, slots, limits, figures, stale bases.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use super::{fake_v2_dir, fake_v2_root, get, put, TempDir, ALL, FAKE_PID, NO_MI};
use crate::cgroup::fake::fake_populate;
use crate::cgroup::files::try_lock_dir;
use crate::cgroup::placement::is_delegated;
use crate::cgroup::{Manager, PeakMemory, Version, HOST_LEAF};

fn tokens(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .split_whitespace()
        .map(|c| c.trim_start_matches('+').to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn fake_v2_base_under_root_when_own_cgroup_is_root() {
    let t = fake_v2_root();
    let m = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap();
    assert_eq!(m.version(), Version::V2);
    assert!(m.fake);
    let base = m.base_dirs()[0].clone();
    assert_eq!(base.parent().unwrap(), t.0);
    let name = base.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with(&format!("agentrl-{}-", std::process::id())),
        "{name}"
    );
    assert_eq!(
        tokens(&get(&t.0.join("cgroup.subtree_control"))),
        ["cpu", "memory", "pids"]
    );
    assert_eq!(
        tokens(&get(&base.join("cgroup.subtree_control"))),
        ["cpu", "memory", "pids"]
    );
    drop(m);
    assert!(!base.exists());
}

#[test]
fn fake_v2_own_cgroup_with_other_processes_goes_to_nearest_empty_ancestor() {
    // A login session's scope: other programs' processes, not delegated.
    let t = fake_v2_root();
    fake_v2_dir(&t.0.join("a"), ALL, "", "");
    fake_v2_dir(&t.0.join("a/b"), ALL, "", "");
    fake_v2_dir(&t.0.join("a/b/c"), "cpu memory pids\n", "", "2147483632\n");
    put(&t.0.join("a/b/cgroup.procs"), "2147483631\n");
    let m = Manager::build(&t.0, None, "0::/a/b/c\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), t.0.join("a"));
    // Nothing was moved or enabled below the chosen ancestor.
    assert_eq!(get(&t.0.join("a/b/c/cgroup.procs")), "2147483632\n");
    assert_eq!(get(&t.0.join("a/b/cgroup.subtree_control")), "");
    assert!(!t.0.join("a/b/c").join(HOST_LEAF).exists());
    assert_eq!(
        tokens(&get(&t.0.join("a/cgroup.subtree_control"))),
        ["cpu", "memory", "pids"]
    );
    // Every cgroup on the way has processes: the true root.
    put(&t.0.join("a/cgroup.procs"), "2147483630\n");
    let m = Manager::build(&t.0, None, "0::/a/b/c\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), t.0);
}

#[test]
fn fake_v2_own_cgroup_with_only_this_process_is_emptied_into_a_leaf() {
    // A service's main process alone in its cgroup: it moves into agentrl-host, and the
    // sandbox stays inside the service's cgroup (and its limits).
    let t = fake_v2_root();
    fake_v2_dir(&t.0.join("system.slice"), ALL, "", "");
    let svc = t.0.join("system.slice/x.service");
    let me = std::process::id();
    fake_v2_dir(&svc, ALL, "", &format!("{me}\n"));
    let m = Manager::build(&t.0, None, "0::/system.slice/x.service\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), svc);
    assert_eq!(get(&svc.join("cgroup.procs")), "");
    assert_eq!(
        get(&svc.join(HOST_LEAF).join("cgroup.procs")),
        me.to_string()
    );
    assert_eq!(
        tokens(&get(&svc.join("cgroup.subtree_control"))),
        ["cpu", "memory", "pids"]
    );
    // A second sandbox of this process finds itself in the leaf: the same parent.
    let m2 = Manager::build(
        &t.0,
        None,
        &format!("0::/system.slice/x.service/{HOST_LEAF}\n"),
        NO_MI,
    )
    .unwrap();
    assert_eq!(m2.base_dirs()[0].parent().unwrap(), svc);
}

#[test]
fn fake_v2_container_root_with_processes_is_emptied_into_a_leaf() {
    // Docker's default on v2: a private cgroup namespace whose root (not the true root:
    // it has cgroup.type) holds the container's processes.
    let t = fake_v2_root();
    put(&t.0.join("cgroup.type"), "domain\n");
    put(&t.0.join("cgroup.procs"), "1\n2147483632\n");
    let m = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), t.0);
    assert_eq!(get(&t.0.join("cgroup.procs")), "");
    assert!(t.0.join(HOST_LEAF).join("cgroup.procs").is_file());
    assert_eq!(
        tokens(&get(&t.0.join("cgroup.subtree_control"))),
        ["cpu", "memory", "pids"]
    );
    // The true root is exempt from the rule: its processes stay where they are.
    let t = fake_v2_root();
    let m = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), t.0);
    assert_eq!(get(&t.0.join("cgroup.procs")), "2147483632\n");
    assert!(!t.0.join(HOST_LEAF).exists());
}

#[test]
fn fake_v2_delegated_own_cgroup_is_emptied_into_a_leaf() {
    let t = fake_v2_root();
    let svc = t.0.join("svc");
    fake_v2_dir(&svc, ALL, "", "2147483631\n2147483632\n");
    let path = CString::new(svc.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated path and name; a 1-byte value of the length passed.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.delegate".as_ptr(),
            b"1".as_ptr().cast(),
            1,
            0,
        )
    };
    if r != 0 {
        eprintln!("skipped: no user xattrs on {}", svc.display());
        return;
    }
    assert!(is_delegated(&svc));
    let m = Manager::build(&t.0, None, "0::/svc\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), svc);
    assert_eq!(get(&svc.join("cgroup.procs")), "");
}

#[test]
fn fake_v2_fallback_error_explains_why_an_ancestor_was_tried() {
    let t = TempDir::new();
    // The root lacks `memory`, so the fallback fails.
    fake_v2_dir(&t.0, "cpu pids\n", "", "2147483632\n");
    fake_v2_dir(&t.0.join("a"), "cpu pids\n", "", "2147483632\n");
    let e = Manager::build(&t.0, None, "0::/a\n", NO_MI).unwrap_err();
    assert!(e.what.contains("also holds other processes"), "{e}");
    assert!(
        e.what.contains("controller 'memory' is not available"),
        "{e}"
    );
}

#[test]
fn fake_v2_own_cgroup_without_processes_is_used_enabling_along_the_way() {
    let t = fake_v2_root();
    fake_v2_dir(&t.0.join("a"), ALL, "", "");
    fake_v2_dir(&t.0.join("a/b"), ALL, "", "");
    let m = Manager::build(&t.0, None, "0::/a/b\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), t.0.join("a/b"));
    for d in ["", "a", "a/b"] {
        let f = t.0.join(d).join("cgroup.subtree_control");
        assert_eq!(
            tokens(&get(&f)),
            ["cpu", "memory", "pids"],
            "{}",
            f.display()
        );
    }
}

#[test]
fn fake_v2_delegated_parent_writes_nothing_above_it() {
    let t = fake_v2_root();
    put(&t.0.join("cgroup.subtree_control"), "cpu memory pids\n");
    fake_v2_dir(&t.0.join("deleg"), "cpu memory pids\n", "memory pids\n", "");
    let m = Manager::build(&t.0, Some(Path::new("deleg")), "0::/elsewhere\n", NO_MI).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), t.0.join("deleg"));
    assert_eq!(
        get(&t.0.join("cgroup.subtree_control")),
        "cpu memory pids\n"
    );
    // Only the missing optional controller was added (fake files get the union).
    assert_eq!(
        tokens(&get(&t.0.join("deleg/cgroup.subtree_control"))),
        ["cpu", "memory", "pids"]
    );
    let abs = t.0.join("deleg");
    let m2 = Manager::build(&t.0, Some(&abs), "0::/\n", NO_MI).unwrap();
    assert_eq!(m2.base_dirs()[0].parent().unwrap(), abs);
}

#[test]
fn fake_v2_errors_name_what_is_missing() {
    let t = TempDir::new();
    fake_v2_dir(&t.0, "cpu io pids\n", "", "");
    let e = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap_err();
    assert!(
        e.what.contains("controller 'memory' is not available"),
        "{e}"
    );
    assert!(e.what.contains("cgroup.controllers"), "{e}");

    let t = fake_v2_root();
    let other = TempDir::new();
    fake_v2_dir(&other.0, ALL, "", "");
    let e = Manager::build(&t.0, Some(&other.0), "0::/\n", NO_MI).unwrap_err();
    assert!(
        e.what.contains("is not inside the cgroup v2 hierarchy"),
        "{e}"
    );
    let e = Manager::build(&t.0, Some(Path::new("missing")), "0::/\n", NO_MI).unwrap_err();
    assert!(e.what.contains("is not a cgroup v2 directory"), "{e}");
    let e = Manager::build(&t.0, None, "4:memory:/x\n", NO_MI).unwrap_err();
    assert!(e.what.contains("no cgroup v2 entry"), "{e}");
}

#[test]
fn fake_v2_mountinfo_strips_mount_root() {
    let t = fake_v2_root();
    fake_v2_dir(&t.0.join("inner"), ALL, "", "");
    let canon = fs::canonicalize(&t.0).unwrap();
    let mi = format!(
        "50 1 0:99 /docker/abc {} rw - cgroup2 cgroup2 rw\n",
        canon.display()
    );
    let mi_fn = move || mi.clone();
    let m = Manager::build(&t.0, None, "0::/docker/abc/inner\n", &mi_fn).unwrap();
    assert_eq!(m.base_dirs()[0].parent().unwrap(), t.0.join("inner"));
}

#[test]
fn fake_v2_slot_limits_and_usage() {
    let t = fake_v2_root();
    let m = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap();
    let mut s = m.create_slot(3).unwrap();
    let d = s.paths()[0].clone();
    assert_eq!(d, m.base_dirs()[0].join("slot-3"));
    assert!(s.dir_fd().is_some());
    assert_eq!(s.peak_memory_mode(), PeakMemory::PerRun);
    assert_eq!(get(&d.join("memory.swap.max")), "0");
    assert!(m
        .create_slot(3)
        .unwrap_err()
        .what
        .contains("cgroup slot-3 already exists"));

    // A run's own cgroup goes beside its slot's and is removed with its handle.
    let run = m.create_run_cgroup(3).unwrap();
    let rd = run.paths()[0].clone();
    assert_eq!(rd, m.base_dirs()[0].join("slot-3-run"));
    assert_eq!(get(&rd.join("memory.swap.max")), "0");
    drop(run);
    assert!(!rd.exists());
    // One left behind (its removal failed) is replaced.
    fs::create_dir(&rd).unwrap();
    fake_populate(&rd, Version::V2).unwrap();
    drop(m.create_run_cgroup(3).unwrap());
    assert!(!rd.exists());

    // A fresh slot is unlimited: nothing written for (None, None).
    s.set_limits(None, None).unwrap();
    assert_eq!(get(&d.join("memory.max")), "max\n");
    s.set_limits(Some(20 << 20), Some(5)).unwrap();
    assert_eq!(get(&d.join("memory.max")), "20971520");
    assert_eq!(get(&d.join("pids.max")), "5");
    // Unchanged values are not rewritten.
    put(&d.join("memory.max"), "untouched");
    put(&d.join("pids.max"), "untouched");
    s.set_limits(Some(20 << 20), Some(5)).unwrap();
    assert_eq!(get(&d.join("memory.max")), "untouched");
    s.set_limits(Some(20 << 20), None).unwrap();
    assert_eq!(get(&d.join("memory.max")), "untouched");
    assert_eq!(get(&d.join("pids.max")), "max");
    s.set_limits(None, None).unwrap();
    assert_eq!(get(&d.join("memory.max")), "max");

    // Per-run figures from the counters.
    put(
        &d.join("cpu.stat"),
        "usage_usec 1000\nuser_usec 600\nsystem_usec 400\n",
    );
    put(
        &d.join("memory.events"),
        "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n",
    );
    put(&d.join("pids.events"), "max 4\n");
    s.prepare_run().unwrap();
    assert_eq!(get(&d.join("memory.peak")), "0\n");
    assert_eq!(s.cpu_time_ns().unwrap(), 0);
    let u = s.usage().unwrap();
    assert!(!u.oom_killed && !u.pids_limit_hit);
    put(
        &d.join("cpu.stat"),
        "usage_usec 251000\nuser_usec 1\nsystem_usec 1\nnr_periods 0\n",
    );
    put(
        &d.join("memory.events"),
        "low 0\nhigh 0\nmax 9\noom 3\noom_kill 3\n",
    );
    put(&d.join("pids.events"), "max 5\n");
    put(&d.join("memory.peak"), "4096\n");
    assert_eq!(s.cpu_time_ns().unwrap(), 250_000_000);
    let u = s.usage().unwrap();
    assert_eq!(u.cpu_time_ns, 250_000_000);
    assert_eq!(u.peak_memory_bytes, Some(4096));
    assert!(u.peak_memory_exact && u.oom_killed && u.pids_limit_hit);
    s.prepare_run().unwrap();
    let u = s.usage().unwrap();
    assert!(!u.oom_killed && !u.pids_limit_hit);
    assert_eq!(u.cpu_time_ns, 0);

    // Parse errors name the file.
    put(&d.join("cpu.stat"), "garbage\n");
    let e = s.cpu_time_ns().unwrap_err();
    assert!(
        e.what.contains("cpu.stat") && e.what.contains("usage_usec"),
        "{e}"
    );

    // attach writes the pid; kill_all on an empty slot writes nothing.
    // (Fake pids lie above any pid_max, and fake mode never signals anyway.)
    assert!(s.attach(0).is_err() && s.attach(-1).is_err());
    s.attach(FAKE_PID).unwrap();
    assert_eq!(get(&d.join("cgroup.procs")), FAKE_PID.to_string());
    assert_eq!(s.process_count().unwrap(), 1);
    assert_eq!(s.kill_all().unwrap(), 1);
    assert_eq!(get(&d.join("cgroup.kill")), "1");
    assert_eq!(s.process_count().unwrap(), 0);
    put(&d.join("cgroup.kill"), "");
    assert_eq!(s.kill_all().unwrap(), 0);
    assert_eq!(
        get(&d.join("cgroup.kill")),
        "",
        "nothing written when empty"
    );

    let base = m.base_dirs()[0].clone();
    drop(m); // slot keeps the base alive
    assert!(base.exists() && d.exists());
    drop(s);
    assert!(!d.exists() && !base.exists());
}

#[test]
fn fake_v2_without_peak_counter_uses_samples() {
    let t = fake_v2_root();
    let m = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap();
    let mut s = m.create_slot(1).unwrap();
    // Simulate a kernel before 5.19: no memory.peak.
    s.peak_file = None;
    s.peak_mode = PeakMemory::Unavailable;
    s.prepare_run().unwrap();
    let d = s.paths()[0].clone();
    assert_eq!(s.usage().unwrap().peak_memory_bytes, None);
    put(&d.join("memory.current"), "777\n");
    assert_eq!(s.sample_memory().unwrap(), 777);
    put(&d.join("memory.current"), "5\n");
    s.sample_memory().unwrap();
    let u = s.usage().unwrap();
    assert_eq!(
        (u.peak_memory_bytes, u.peak_memory_exact),
        (Some(777), false)
    );
}

#[test]
fn fake_remove_stale() {
    let t = fake_v2_root();
    // A dead owner (pid 0x7fff_fff0 is far above pid_max) and a live one (us).
    let dead = t.0.join("agentrl-2147483632-0");
    fake_v2_dir(&dead, ALL, "", "");
    fake_v2_dir(&dead.join("slot-0"), ALL, "", "");
    let live = t.0.join(format!("agentrl-{}-999999", std::process::id()));
    fake_v2_dir(&live, ALL, "", "");
    // A dead owner's base that another process (here: this test) still holds locked.
    let held = t.0.join("agentrl-2147483633-0");
    fake_v2_dir(&held, ALL, "", "");
    let lock = try_lock_dir(&held).unwrap().expect("lock");
    let m = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap();
    // All of them are younger than the grace period: nothing is taken.
    assert_eq!(m.remove_stale(), 0);
    assert_eq!(m.remove_stale_older_than(Duration::ZERO), 1);
    assert!(!dead.exists() && live.exists() && held.exists());
    // Our own base is locked while the manager lives.
    let ours = m.base_dirs()[0].clone();
    assert!(try_lock_dir(&ours).unwrap().is_none());
    drop(lock);
    assert_eq!(m.remove_stale_older_than(Duration::ZERO), 1);
    assert!(!held.exists() && ours.exists());
    drop(m);
    assert!(!ours.exists());
}
