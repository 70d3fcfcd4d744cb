//! Fake v1 trees: discovery, parent override, limits and figures.

use std::path::Path;

use super::{get, put, TempDir, FAKE_PID, NO_MI};
use crate::cgroup::{Manager, PeakMemory, Version};

pub(super) fn fake_v1_root(with_pids: bool) -> TempDir {
    let t = TempDir::new();
    let mut hier = vec!["memory", "cpu,cpuacct"];
    if with_pids {
        hier.push("pids");
    }
    for h in hier {
        put(&t.0.join(h).join("cgroup.procs"), "2147483632\n");
    }
    put(&t.0.join("unified/cgroup.controllers"), "hugetlb\n");
    t
}

#[test]
fn fake_v1_discovery_and_limits() {
    let t = fake_v1_root(true);
    put(&t.0.join("memory/mine/cgroup.procs"), "2147483632\n");
    let self_cg = "8:pids:/\n4:memory:/mine\n2:cpu,cpuacct:/gone\n0::/\n";
    let m = Manager::build(&t.0, None, self_cg, NO_MI).unwrap();
    assert_eq!(m.version(), Version::V1);
    let bases = m.base_dirs().to_vec();
    assert_eq!(bases.len(), 3);
    assert_eq!(bases[0].parent().unwrap(), t.0.join("memory/mine"));
    assert_eq!(bases[1].parent().unwrap(), t.0.join("pids"));
    // Own cgroup not visible: the top of the mount is used.
    assert_eq!(bases[2].parent().unwrap(), t.0.join("cpu,cpuacct"));

    let mut s = m.create_slot(0).unwrap();
    assert!(s.dir_fd().is_none());
    assert_eq!(s.peak_memory_mode(), PeakMemory::PerRun);
    let [md, pd, cd] = [0, 1, 2].map(|i| s.paths()[i].clone());
    s.set_limits(Some(20 << 20), Some(5)).unwrap();
    assert_eq!(get(&md.join("memory.limit_in_bytes")), "20971520");
    assert_eq!(get(&md.join("memory.memsw.limit_in_bytes")), "20971520");
    assert_eq!(get(&pd.join("pids.max")), "5");
    s.set_limits(None, None).unwrap();
    assert_eq!(get(&md.join("memory.limit_in_bytes")), "-1");
    assert_eq!(get(&md.join("memory.memsw.limit_in_bytes")), "-1");
    assert_eq!(get(&pd.join("pids.max")), "max");

    put(&cd.join("cpuacct.usage"), "1000\n");
    put(
        &md.join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    );
    s.prepare_run().unwrap();
    assert_eq!(get(&md.join("memory.max_usage_in_bytes")), "0");
    put(&cd.join("cpuacct.usage"), "5000\n");
    put(&md.join("memory.max_usage_in_bytes"), "52428800\n");
    put(
        &md.join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 1\noom_kill 2\n",
    );
    put(&pd.join("pids.events"), "max 1\n");
    let u = s.usage().unwrap();
    assert_eq!(u.cpu_time_ns, 4000);
    assert_eq!(u.peak_memory_bytes, Some(52_428_800));
    assert!(u.peak_memory_exact && u.oom_killed && u.pids_limit_hit);

    s.attach(FAKE_PID).unwrap();
    for d in [&md, &pd, &cd] {
        assert_eq!(get(&d.join("cgroup.procs")), FAKE_PID.to_string());
    }
    assert_eq!(s.kill_all().unwrap(), 1);
    for d in [&md, &pd, &cd] {
        assert_eq!(get(&d.join("cgroup.procs")), "");
    }
    s.attach(FAKE_PID).unwrap(); // left for Drop, which must not hang or signal
    drop(s);
    drop(m);
    for d in bases.iter().chain([&md, &pd, &cd]) {
        assert!(!d.exists(), "{}", d.display());
    }
}

#[test]
fn fake_v1_parent_override() {
    let t = fake_v1_root(true);
    for h in ["memory", "pids", "cpu,cpuacct"] {
        put(&t.0.join(h).join("svc/cgroup.procs"), "");
    }
    let m = Manager::build(&t.0, Some(Path::new("svc")), "", NO_MI).unwrap();
    assert!(m
        .base_dirs()
        .iter()
        .all(|b| b.parent().unwrap().ends_with("svc")));
    let abs = t.0.join("pids/svc");
    let m2 = Manager::build(&t.0, Some(&abs), "", NO_MI).unwrap();
    assert_eq!(m2.base_dirs()[0].parent().unwrap(), t.0.join("memory/svc"));
    let e = Manager::build(&t.0, Some(Path::new("/elsewhere")), "", NO_MI).unwrap_err();
    assert!(
        e.what.contains("not inside any of the v1 hierarchies"),
        "{e}"
    );
}

#[test]
fn fake_v1_missing_controller_is_named() {
    let t = fake_v1_root(false);
    let e = Manager::build(&t.0, None, "", NO_MI).unwrap_err();
    assert!(
        e.what
            .starts_with("cgroup v1 controller 'pids' is not mounted"),
        "{e}"
    );
}
