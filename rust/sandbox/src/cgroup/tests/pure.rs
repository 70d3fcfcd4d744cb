//! Pure helpers: parsers, the memsw write order, the per-run peak, error display.

use std::io;
use std::path::{Path, PathBuf};

use crate::cgroup::detect::{mount_root_of, own_cgroup};
use crate::cgroup::files::{fmt_u64, keyed_u64, parse_pids, parse_u64};
use crate::cgroup::slot::{memsw_first, peak_for_run};
use crate::cgroup::{CgroupError, PeakMemory};

#[test]
fn parses_proc_self_cgroup() {
    let text = "12:pids:/user.slice\n4:cpu,cpuacct:/a/b\n3:memory:/m\n1:name=systemd:/s\n0::/u/v\n";
    assert_eq!(own_cgroup(text, None), Some("/u/v"));
    assert_eq!(own_cgroup(text, Some("cpuacct")), Some("/a/b"));
    assert_eq!(own_cgroup(text, Some("cpu")), Some("/a/b"));
    assert_eq!(own_cgroup(text, Some("memory")), Some("/m"));
    assert_eq!(own_cgroup(text, Some("pids")), Some("/user.slice"));
    assert_eq!(own_cgroup(text, Some("systemd")), None);
    assert_eq!(own_cgroup("4:memory:/m\n", None), None);
}

#[test]
fn parses_mountinfo_root() {
    let mi = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
              40 31 0:30 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    assert_eq!(
        mount_root_of(mi, Path::new("/sys/fs/cgroup/memory")),
        Some(PathBuf::from("/docker/abc"))
    );
    assert_eq!(mount_root_of(mi, Path::new("/nope")), None);
}

#[test]
fn parses_cgroup_files() {
    assert_eq!(parse_u64(b"123\n"), Some(123));
    assert_eq!(parse_u64(b"max\n"), None);
    let stat = b"usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n";
    assert_eq!(keyed_u64(stat, "usage_usec"), Some(2500));
    assert_eq!(keyed_u64(stat, "usage"), None);
    let oom = b"oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
    assert_eq!(keyed_u64(oom, "oom_kill"), Some(7));
    assert_eq!(parse_pids(b"12\n345\n\n"), vec![12, 345]);
    let mut buf = [0u8; 20];
    assert_eq!(fmt_u64(0, &mut buf), b"0");
    assert_eq!(fmt_u64(4_194_304, &mut buf), b"4194304");
    assert_eq!(fmt_u64(u64::MAX, &mut buf), b"18446744073709551615");
}

#[test]
fn memsw_ordering() {
    let unlimited = 9_223_372_036_854_771_712;
    // Lowering from unlimited: memory first.
    assert!(!memsw_first(unlimited, 20 << 20));
    // Raising: memsw first, including to unlimited.
    assert!(memsw_first(20 << 20, 64 << 20));
    assert!(memsw_first(20 << 20, u64::MAX));
    assert!(!memsw_first(64 << 20, 20 << 20));
}

#[test]
fn peak_logic() {
    use PeakMemory::*;
    assert_eq!(peak_for_run(PerRun, 0, Some(10), 0), (Some(10), true));
    // Lifetime peak rose during the run: exact.
    assert_eq!(
        peak_for_run(LifetimeOnly, 100, Some(150), 40),
        (Some(150), true)
    );
    // Did not rise: sampled lower bound, or nothing.
    assert_eq!(
        peak_for_run(LifetimeOnly, 100, Some(100), 40),
        (Some(40), false)
    );
    assert_eq!(peak_for_run(LifetimeOnly, 100, Some(100), 0), (None, false));
    assert_eq!(peak_for_run(Unavailable, 0, None, 5), (Some(5), false));
    assert_eq!(peak_for_run(Unavailable, 0, None, 0), (None, false));
}

#[test]
fn error_display_names_path() {
    let e = CgroupError::io(
        "cannot read /x/y",
        io::Error::from_raw_os_error(libc::ENOENT),
    );
    let s = e.to_string();
    assert!(s.starts_with("cannot read /x/y: "), "{s}");
    assert!(std::error::Error::source(&e).is_some());
}
