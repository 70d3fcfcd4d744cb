//! Control groups for sandbox slots, on cgroup v2 (unified) or cgroup v1 hosts.
//!
//! A sandbox has N concurrency *slots*. Each slot owns one cgroup (v2) or one cgroup per
//! hierarchy (v1: `memory`, `pids`, `cpuacct`). Cgroups are created once, reused for every run
//! in that slot, and removed when the [`Slot`] is dropped; the private base cgroup that holds
//! the slots is removed once the [`Manager`] and all of its slots are gone. Per-run work is a
//! handful of small reads and writes through directory fds (`openat`), never a directory scan.
//!
//! The design (detection, where the base goes, what is reset per run, how exact the per-run
//! figures are, costs, fake trees for tests) is in `docs/design/cgroups.md`.
//!
//! Layout: `detect` (hierarchies, own cgroup, hidden kernel features), `placement` (where the
//! base goes on v2), `manager` ([`Manager`]: the base and its controllers), `stale` (removal of
//! bases left behind), `slot` ([`Slot`]: limits and per-run figures), `nsjail` (the nsjail
//! backend's mode: [`JailRun`], a run's cgroup below nsjail's own), `dirs` (directory
//! removal), `files` (small file and system call helpers), `fake` (fake trees for tests).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::fmt;
use std::io;
use std::time::Duration;

mod detect;
mod dirs;
mod fake;
mod files;
mod manager;
mod nsjail;
mod placement;
mod slot;
mod stale;
#[cfg(test)]
mod tests;

pub use detect::{hidden, HIDE_ENV};
pub use manager::Manager;
pub use nsjail::{detect_version, JailRun, JailUsage};
pub use placement::default_v2_parent_dir;
pub use slot::Slot;

/// Where cgroup file systems are mounted on a normal host.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";

/// Prefix of the private base cgroup's name: `agentrl-<pid>-<n>`.
const BASE_PREFIX: &str = "agentrl-";
/// Prefix of the nsjail backend's base cgroup: `agentrl-nsjail-<pid>-<n>` (never taken for a
/// stale `agentrl-<pid>-<n>`: `nsjail` is no pid).
const NSJAIL_BASE_PREFIX: &str = "agentrl-nsjail-";

/// On v2, the leaf cgroup the processes of our own cgroup move to when the sandbox's base must
/// go in that cgroup (see [`Manager::new`]). Not a base name (`agentrl-<pid>-<n>`), so stale
/// removal never takes it.
pub const HOST_LEAF: &str = "agentrl-host";
/// How long [`Slot::kill_all`] waits for killed processes to leave the cgroup.
const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long removal retries `rmdir` while it answers `EBUSY` (processes still exiting).
const RMDIR_TIMEOUT: Duration = Duration::from_millis(500);
/// A base cgroup younger than this is never taken for stale: its owner may be between its
/// `mkdir` and its `flock`.
pub const STALE_GRACE: Duration = Duration::from_secs(30);

const CGROUP_SUPER_MAGIC: u64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// v2 controllers that must be available to the slots.
const V2_REQUIRED: [&str; 2] = ["memory", "pids"];
/// v2 controllers enabled when the parent offers them.
const V2_OPTIONAL: [&str; 1] = ["cpu"];
/// v1 controllers a slot uses, indexed by [`MEM`], [`PIDS`], [`CPU`].
const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpuacct"];
const MEM: usize = 0;
const PIDS: usize = 1;
const CPU: usize = 2;

/// Value v1 reports for an unlimited memory limit (`PAGE_COUNTER_MAX` pages, 4 KiB pages).
const V1_UNLIMITED: &str = "9223372036854771712\n";

/// Which cgroup version the manager drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Legacy per-controller hierarchies (`memory`, `pids`, `cpuacct`).
    V1,
    /// The unified hierarchy.
    V2,
}

/// How [`Usage::peak_memory_bytes`] is obtained for a slot (depends on the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakMemory {
    /// The watermark is reset before each run: exact per run (v1; v2 on Linux 6.12+).
    PerRun,
    /// v2 `memory.peak` exists but cannot be reset (Linux 5.19–6.11): exact only when a run
    /// raises the slot's lifetime peak; otherwise [`Slot::sample_memory`] values are used.
    LifetimeOnly,
    /// No peak counter (v2 before 5.19): only [`Slot::sample_memory`] values.
    Unavailable,
}

/// A cgroup operation failed; `what` names the file or directory and what is missing.
#[derive(Debug)]
pub struct CgroupError {
    /// What failed, naming the path involved and, where known, what the host lacks.
    pub what: String,
    /// The underlying I/O error, if any.
    pub source: Option<io::Error>,
}

impl CgroupError {
    fn msg(what: impl Into<String>) -> Self {
        CgroupError {
            what: what.into(),
            source: None,
        }
    }

    fn io(what: impl Into<String>, source: io::Error) -> Self {
        CgroupError {
            what: what.into(),
            source: Some(source),
        }
    }
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(e) => write!(f, "{}: {}", self.what, e),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for CgroupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Per-run resource figures, see `docs/design/cgroups.md` for their exactness.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// CPU time (user + system) of all processes in the slot since [`Slot::prepare_run`].
    pub cpu_time_ns: u64,
    /// Peak memory charged to the slot during the run, when known.
    pub peak_memory_bytes: Option<u64>,
    /// `true` when `peak_memory_bytes` is the exact per-run peak; `false` when it is a lower
    /// bound from [`Slot::sample_memory`] (or absent).
    pub peak_memory_exact: bool,
    /// The OOM killer killed a process of the slot during the run (v1 before 4.13: the memory
    /// limit was hit).
    pub oom_killed: bool,
    /// A fork failed during the run because the pids limit was reached.
    pub pids_limit_hit: bool,
}

// Slots move between threads (and the manager is shared); keep it that way.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Slot>();
    assert_send_sync::<Manager>();
    assert_send_sync::<JailRun>();
};
