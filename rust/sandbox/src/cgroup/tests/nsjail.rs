//! The nsjail backend's mode on fake trees: its base, limits (no memsw on v1, the subtree
//! controllers on v2), the v1 OOM eventfd, its counters, the kill that spares nsjail, and the
//! removal of nsjail's child cgroups; and that it leaves the native mode as it was.

use std::path::Path;

use super::fake_v1::fake_v1_root;
use super::{fake_v2_root, get, put, TempDir, FAKE_PID, NO_MI};
use crate::cgroup::manager::Mode;
use crate::cgroup::{detect_version, JailUsage, Manager, Version, V1_UNLIMITED};

fn tokens(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .split_whitespace()
        .map(|c| c.trim_start_matches('+').to_string())
        .collect();
    v.sort();
    v
}

fn base_name(p: &Path) -> String {
    p.file_name().unwrap().to_str().unwrap().to_string()
}

/// Adds `n` to eventfd `fd` (as the kernel does on an OOM notification).
fn notify(fd: i32, n: u64) {
    // SAFETY: writes the 8 bytes of `n`, which outlives the call, to an eventfd of this
    // process that the run under test keeps open.
    let w = unsafe { libc::write(fd, (&n as *const u64).cast::<libc::c_void>(), 8) };
    assert_eq!(w, 8);
}

#[test]
fn detect_version_names_the_usable_hierarchy() {
    assert_eq!(detect_version(&fake_v2_root().0), Some(Version::V2));
    assert_eq!(detect_version(&fake_v1_root(true).0), Some(Version::V1));
    assert_eq!(detect_version(&fake_v1_root(false).0), None);
    assert_eq!(detect_version(&TempDir::new().0), None);
}

#[test]
fn nsjail_v1_limits_counters_kill_and_removal() {
    let t = fake_v1_root(true);
    let m = Manager::build_for(Mode::Nsjail, &t.0, None, "", NO_MI).unwrap();
    assert_eq!(m.version(), Version::V1);
    let prefix = format!("agentrl-nsjail-{}-", std::process::id());
    assert!(m
        .base_dirs()
        .iter()
        .all(|b| base_name(b).starts_with(&prefix)));
    assert_eq!(m.mount_of("memory").unwrap(), t.0.join("memory"));
    assert_eq!(m.mount_of("pids").unwrap(), t.0.join("pids"));
    assert_eq!(m.mount_of("cpuacct").unwrap(), t.0.join("cpu,cpuacct"));
    assert!(m.mount_of("cpu").is_err());

    // A host without cgroup.event_control (or swappiness): no OOM count, limits still set.
    let mut plain = m.create_jail_run(0).unwrap();
    plain.set_limits(20 << 20, 5).unwrap();
    let md = plain.dir("memory").unwrap().to_path_buf();
    assert_eq!(md, m.base_dirs()[0].join("run-0"));
    assert_eq!(get(&md.join("memory.limit_in_bytes")), "20971520");
    // No memsw limit: with one, v1 counts no failure in memory.failcnt.
    assert_eq!(get(&md.join("memory.memsw.limit_in_bytes")), V1_UNLIMITED);
    assert_eq!(get(&plain.dir("pids").unwrap().join("pids.max")), "5");
    assert_eq!(plain.usage().oom_kill, None);
    assert!(m.create_jail_run(0).is_err(), "run-0 exists");
    plain.remove().unwrap();
    assert!(!md.exists());

    let mut run = m.create_jail_run(1).unwrap();
    let [md, pd, cd] = ["memory", "pids", "cpuacct"].map(|c| run.dir(c).unwrap().to_path_buf());
    put(&md.join("memory.swappiness"), "60\n");
    put(&md.join("cgroup.event_control"), "");
    run.set_limits(1 << 30, 64).unwrap();
    assert_eq!(get(&md.join("memory.swappiness")), "0");
    let line = get(&md.join("cgroup.event_control"));
    let efd: i32 = line.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(line.split_whitespace().count(), 2, "{line:?}");

    put(&md.join("memory.max_usage_in_bytes"), "52428800\n");
    put(&md.join("memory.failcnt"), "3\n");
    put(&pd.join("pids.peak"), "64\n");
    put(&cd.join("cpuacct.usage"), "1234\n");
    let want = |oom| JailUsage {
        peak: Some(52_428_800),
        failcnt: Some(3),
        oom_kill: Some(oom),
        pids_peak: Some(64),
        pids_max_events: None,
    };
    assert_eq!(run.usage(), want(0));
    notify(efd, 1);
    assert_eq!(run.usage(), want(1));
    assert_eq!(
        run.usage(),
        want(1),
        "a read of the eventfd does not lose the count"
    );
    notify(efd, 2);
    assert_eq!(run.usage(), want(3));
    assert_eq!(run.cpu_ns().unwrap(), 1234);

    // nsjail (FAKE_PID) in the run's cpuacct cgroup, its jail in a child cgroup of its own.
    let nsjail = FAKE_PID;
    put(
        &cd.join("cgroup.procs"),
        &format!("{nsjail}\n{}\n", nsjail - 1),
    );
    put(
        &md.join("NSJAIL.7/cgroup.procs"),
        &format!("{}\n", nsjail - 2),
    );
    put(&md.join("NSJAIL.7/memory.limit_in_bytes"), "1\n");
    assert_eq!(run.kill_except(nsjail), 2);
    assert_eq!(get(&cd.join("cgroup.procs")), format!("{nsjail}\n"));
    assert_eq!(get(&md.join("NSJAIL.7/cgroup.procs")), "");
    assert_eq!(run.kill_except(nsjail), 0, "only nsjail is left");

    // nsjail's child cgroup (left when nsjail itself was killed) goes with the run's.
    run.remove().unwrap();
    for d in [&md, &pd, &cd] {
        assert!(!d.exists(), "{}", d.display());
    }
    let bases = m.base_dirs().to_vec();
    drop(m);
    assert!(bases.iter().all(|b| !b.exists()));
}

#[test]
fn nsjail_v2_enables_only_what_nsjail_needs_and_reads_its_counters() {
    let t = fake_v2_root();
    let m = Manager::build_for(Mode::Nsjail, &t.0, None, "0::/\n", NO_MI).unwrap();
    assert_eq!(m.version(), Version::V2);
    let base = m.base_dirs()[0].clone();
    assert!(base_name(&base).starts_with(&format!("agentrl-nsjail-{}-", std::process::id())));
    // Only the required controllers, as the nsjail backend always enabled (the native mode
    // adds cpu where offered: fake_v2_base_under_root_when_own_cgroup_is_root).
    assert_eq!(
        tokens(&get(&t.0.join("cgroup.subtree_control"))),
        ["memory", "pids"]
    );
    assert_eq!(
        tokens(&get(&base.join("cgroup.subtree_control"))),
        ["memory", "pids"]
    );
    assert_eq!(m.mount_of("memory").unwrap(), t.0);

    let mut run = m.create_jail_run(4).unwrap();
    let d = run.dir("memory").unwrap().to_path_buf();
    assert_eq!(d, base.join("run-4"));
    assert_eq!(run.dir("cpuacct").unwrap(), d);
    run.set_limits(1 << 20, 7).unwrap();
    assert_eq!(get(&d.join("memory.max")), "1048576");
    assert_eq!(get(&d.join("memory.swap.max")), "0");
    assert_eq!(get(&d.join("pids.max")), "7");
    // nsjail's own cgroup below the run's gets memory and pids.
    assert_eq!(
        tokens(&get(&d.join("cgroup.subtree_control"))),
        ["memory", "pids"]
    );

    put(
        &d.join("memory.events"),
        "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n",
    );
    put(&d.join("memory.peak"), "4096\n");
    put(&d.join("pids.events"), "max 3\n");
    put(
        &d.join("cpu.stat"),
        "usage_usec 5\nuser_usec 4\nsystem_usec 1\n",
    );
    assert_eq!(
        run.usage(),
        JailUsage {
            peak: Some(4096),
            failcnt: Some(2),
            oom_kill: Some(1),
            pids_peak: None, // the fake tree has no pids.peak
            pids_max_events: Some(3),
        }
    );
    assert_eq!(run.cpu_ns().unwrap(), 5000);

    put(
        &d.join("NSJAIL.9/cgroup.procs"),
        &format!("{}\n", FAKE_PID - 1),
    );
    assert_eq!(run.kill_except(FAKE_PID), 1);
    assert_eq!(get(&d.join("cgroup.kill")), "1");
    assert_eq!(get(&d.join("NSJAIL.9/cgroup.procs")), "");
    run.remove().unwrap();
    assert!(!d.exists());
    drop(m);
    assert!(!base.exists());
}

#[test]
fn nsjail_base_is_never_taken_for_a_stale_native_one() {
    let t = fake_v2_root();
    let native = Manager::build(&t.0, None, "0::/\n", NO_MI).unwrap();
    // Both left by a dead process (FAKE_PID is above any pid_max).
    let stale_nsjail = t.0.join(format!("agentrl-nsjail-{FAKE_PID}-0"));
    let stale_native = t.0.join(format!("agentrl-{FAKE_PID}-0"));
    for d in [&stale_nsjail, &stale_native] {
        put(&d.join("cgroup.procs"), "");
    }
    assert_eq!(native.remove_stale_older_than(std::time::Duration::ZERO), 1);
    assert!(!stale_native.exists());
    assert!(stale_nsjail.exists());
}
