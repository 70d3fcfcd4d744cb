//! Fake trees (tests): the interface files the kernel would create in a new cgroup, written
//! when the manager's root is not a cgroup file system.

use std::fs;
use std::io;
use std::path::Path;

use super::{Version, V1_UNLIMITED};

const FAKE_V2_FILES: &[(&str, &str)] = &[
    ("cgroup.procs", ""),
    ("cgroup.subtree_control", ""),
    ("cgroup.events", "populated 0\nfrozen 0\n"),
    ("cgroup.kill", ""),
    ("cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"),
    ("memory.current", "0\n"),
    ("memory.max", "max\n"),
    ("memory.swap.max", "max\n"),
    ("memory.peak", "0\n"),
    (
        "memory.events",
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    ),
    ("pids.current", "0\n"),
    ("pids.max", "max\n"),
    ("pids.events", "max 0\n"),
];

const FAKE_V1_FILES: &[(&str, &str)] = &[
    ("cgroup.procs", ""),
    ("tasks", ""),
    ("memory.limit_in_bytes", V1_UNLIMITED),
    ("memory.memsw.limit_in_bytes", V1_UNLIMITED),
    ("memory.max_usage_in_bytes", "0\n"),
    ("memory.usage_in_bytes", "0\n"),
    ("memory.failcnt", "0\n"),
    (
        "memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    ),
    ("pids.max", "max\n"),
    ("pids.events", "max 0\n"),
    ("cpuacct.usage", "0\n"),
];

/// Creates the interface files the kernel would create in a new cgroup directory `dir`.
pub(super) fn fake_populate(dir: &Path, version: Version) -> io::Result<()> {
    let files = match version {
        Version::V1 => FAKE_V1_FILES,
        Version::V2 => {
            let parent = dir.parent().unwrap_or(dir);
            let enabled = fs::read_to_string(parent.join("cgroup.subtree_control"))
                .unwrap_or_default()
                .split_whitespace()
                .map(|c| c.trim_start_matches('+'))
                .collect::<Vec<_>>()
                .join(" ");
            fs::write(dir.join("cgroup.controllers"), enabled + "\n")?;
            FAKE_V2_FILES
        }
    };
    for (name, content) in files {
        fs::write(dir.join(name), content)?;
    }
    Ok(())
}
