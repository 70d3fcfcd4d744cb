//! The nsjail backend's mode ([`Manager::for_nsjail`], [`JailRun`]): a fresh cgroup per run
//! (`run-<n>` under the base `agentrl-nsjail-<pid>-<n>`) that carries the exact limits, while
//! nsjail puts the jail in a cgroup of its own *below* it and removes that one as soon as the
//! jail ends. What differs from a [`Slot`] follows from that child cgroup and from nsjail
//! being the supervisor's child:
//!
//! * v1 counts an OOM kill in the victim's cgroup (nsjail's, gone before it could be read) but
//!   notifies the cgroup whose limit fired (the run's) through an eventfd registered on
//!   `cgroup.event_control`: [`JailUsage::oom_kill`] counts those notifications.
//! * v1 has no memsw limit (with one, v1 counts no failure in `memory.failcnt`, the only trace
//!   of the limit firing that survives nsjail's cleanup); swappiness 0 keeps the run out of
//!   swap instead.
//! * v2: nsjail's child cgroup needs `+memory +pids` in the run's `cgroup.subtree_control`.
//! * Killing spares nsjail itself (on v1 it sits in the run's `cpuacct` cgroup), so that it
//!   reaps its jail and writes the log the verdict depends on; it walks nsjail's child
//!   cgroups too.
//! * Every figure is read as the backend needs it for its verdict ([`JailUsage`]), `None`
//!   where the host lacks the file.
//!
//! The native backend's slots are untouched by all of this: only a manager made by
//! [`Manager::for_nsjail`] makes [`JailRun`]s.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::detect::{find_v1_mount, read_mountinfo, read_self_cgroup};
use super::files::{errno, open_at, parse_pids, sigkill};
use super::manager::Mode;
use super::{
    CgroupError, Manager, Slot, Version, DEFAULT_ROOT, KILL_TIMEOUT, MEM, PIDS, V1_CONTROLLERS,
};

/// How long [`JailRun::remove`] retries `rmdir` while the kernel answers `EBUSY`.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause between two rounds of [`JailRun::kill_except`].
const KILL_PAUSE: Duration = Duration::from_millis(2);

/// Which cgroup version [`Manager::new`] would drive under `root` (v2: a unified hierarchy
/// at `root`; v1: `memory`, `pids` and `cpuacct` mounted below it), or `None` when neither is
/// usable, without creating anything.
pub fn detect_version(root: &Path) -> Option<Version> {
    if root.join("cgroup.controllers").is_file() {
        return Some(Version::V2);
    }
    V1_CONTROLLERS
        .iter()
        .all(|c| find_v1_mount(root, c).is_some())
        .then_some(Version::V1)
}

/// Index of a controller by its v1 name (`memory`, `pids`, `cpuacct`).
fn controller(name: &str) -> Result<usize, CgroupError> {
    V1_CONTROLLERS
        .iter()
        .position(|c| *c == name)
        .ok_or_else(|| {
            CgroupError::msg(format!(
                "unknown controller {name:?} (expected one of {V1_CONTROLLERS:?})"
            ))
        })
}

impl Manager {
    /// A manager for the nsjail backend: detection and placement as [`Manager::new`], but the
    /// base is `agentrl-nsjail-<pid>-<n>`, v2 enables only the required controllers, and no
    /// stale base is removed (see the module doc).
    pub fn for_nsjail(parent: Option<&Path>) -> Result<Manager, CgroupError> {
        Self::build_for(
            Mode::Nsjail,
            Path::new(DEFAULT_ROOT),
            parent,
            &read_self_cgroup()?,
            &read_mountinfo,
        )
    }

    /// Where the hierarchy of `controller` (`memory`, `pids`, `cpuacct`) is mounted (v2: the
    /// root), as nsjail's v1 flags name it.
    pub fn mount_of(&self, controller_name: &str) -> Result<&Path, CgroupError> {
        Ok(&self.mounts[self.ctl[controller(controller_name)?]])
    }

    /// Creates the cgroup(s) of nsjail run `n` (`run-<n>` under the base), without limits.
    /// Fails if it exists.
    pub fn create_jail_run(&self, n: usize) -> Result<JailRun, CgroupError> {
        Ok(JailRun {
            slot: self.create(format!("run-{n}"), n)?,
            oom: None,
        })
    }
}

/// A v1 eventfd registered for the OOM notifications of a run's memory cgroup, and the
/// `memory.oom_control` it watches (kept open as long as the registration).
#[derive(Debug)]
struct OomWatch {
    event: OwnedFd,
    _control: File,
    /// Notifications read so far (a read of an eventfd resets it).
    seen: AtomicU64,
}

impl OomWatch {
    /// Registers a new eventfd on `cgroup.event_control`; `None` when the host refuses (the
    /// backend then judges an OOM by `memory.failcnt`).
    fn register(slot: &Slot) -> Option<OomWatch> {
        // SAFETY: eventfd takes plain integers; no memory is involved.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned by eventfd, is valid and owned by nobody else.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        let dir = slot.fds[slot.ctl[MEM]].as_fd();
        let control = open_at(dir, c"memory.oom_control", libc::O_RDONLY).ok()?;
        let line = format!("{} {}", event.as_raw_fd(), control.as_raw_fd());
        slot.write_raw(MEM, c"cgroup.event_control", line.as_bytes())
            .ok()?;
        Some(OomWatch {
            event,
            _control: control,
            seen: AtomicU64::new(0),
        })
    }

    /// Notifications so far; `None` if the eventfd cannot be read.
    fn count(&self) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into `v`, a u64 that outlives the call; the fd is
        // owned by `self`.
        let n = unsafe {
            libc::read(
                self.event.as_raw_fd(),
                (&mut v as *mut u64).cast::<libc::c_void>(),
                8,
            )
        };
        if n == 8 {
            return Some(self.seen.fetch_add(v, Ordering::Relaxed) + v);
        }
        let e = io::Error::last_os_error();
        (n < 0 && errno(&e) == libc::EAGAIN).then(|| self.seen.load(Ordering::Relaxed))
    }
}

/// The counters the nsjail backend judges a run by; `None` where the host lacks the file (or
/// the figure: v1 has no usable `pids.events`, nor, without the eventfd, an OOM count).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JailUsage {
    /// Peak memory of the run (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub peak: Option<u64>,
    /// How often the memory limit was hit (v1 `memory.failcnt`, v2 `memory.events` `max`).
    pub failcnt: Option<u64>,
    /// OOM kills (v1: notifications of the eventfd, v2: `memory.events` `oom_kill`).
    pub oom_kill: Option<u64>,
    /// Peak number of processes (`pids.peak`).
    pub pids_peak: Option<u64>,
    /// Forks refused by the pids limit (v2 `pids.events` `max`; v1 counts them in nsjail's
    /// removed cgroup: `None`).
    pub pids_max_events: Option<u64>,
}

/// The cgroup(s) of one nsjail run (see the module doc). Dropping it without
/// [`JailRun::remove`] removes it as a [`Slot`] is removed.
#[derive(Debug)]
pub struct JailRun {
    slot: Slot,
    oom: Option<OomWatch>,
}

impl JailRun {
    /// The cgroup version.
    pub fn version(&self) -> Version {
        self.slot.version
    }

    /// The run's directory in the hierarchy of `controller` (`memory`, `pids`, `cpuacct`;
    /// v2: the one directory).
    pub fn dir(&self, controller_name: &str) -> Result<&Path, CgroupError> {
        Ok(&self.slot.dirs[self.slot.ctl[controller(controller_name)?]])
    }

    /// Writes the exact limits. v1: `memory.limit_in_bytes` (no memsw), swappiness 0 where
    /// the host allows it, `pids.max`, then the OOM eventfd. v2: `memory.max`, `pids.max`
    /// and `+memory +pids` in `cgroup.subtree_control` for nsjail's child cgroup.
    pub fn set_limits(&mut self, memory_bytes: u64, max_pids: u64) -> Result<(), CgroupError> {
        let s = &self.slot;
        match s.version {
            Version::V1 => {
                s.write(MEM, c"memory.limit_in_bytes", &memory_bytes.to_string())?;
                let _ = s.write_raw(MEM, c"memory.swappiness", b"0");
                s.write(PIDS, c"pids.max", &max_pids.to_string())?;
                if self.oom.is_none() {
                    self.oom = OomWatch::register(s);
                }
            }
            Version::V2 => {
                s.write(MEM, c"memory.max", &memory_bytes.to_string())?;
                s.write(PIDS, c"pids.max", &max_pids.to_string())?;
                s.write(MEM, c"cgroup.subtree_control", "+memory +pids")?;
            }
        }
        Ok(())
    }

    /// CPU time (ns) of every process of the run (v1 `cpuacct.usage`, v2 `cpu.stat`).
    pub fn cpu_ns(&self) -> Result<u64, CgroupError> {
        self.slot.cpu_raw()
    }

    /// The counters of the run so far (see [`JailUsage`]).
    pub fn usage(&self) -> JailUsage {
        let read = |c, name, key| self.slot.read_u64(c, name, key).ok();
        match self.slot.version {
            Version::V1 => JailUsage {
                peak: read(MEM, c"memory.max_usage_in_bytes", None),
                failcnt: read(MEM, c"memory.failcnt", None),
                oom_kill: self.oom.as_ref().and_then(OomWatch::count),
                pids_peak: read(PIDS, c"pids.peak", None),
                pids_max_events: None,
            },
            Version::V2 => JailUsage {
                peak: read(MEM, c"memory.peak", None),
                failcnt: read(MEM, c"memory.events", Some("max")),
                oom_kill: read(MEM, c"memory.events", Some("oom_kill")),
                pids_peak: read(PIDS, c"pids.peak", None),
                pids_max_events: read(PIDS, c"pids.events", Some("max")),
            },
        }
    }

    /// The processes in the run's cgroups and in every cgroup below them, but `exclude`
    /// and this process.
    fn procs(&self, exclude: libc::pid_t) -> BTreeSet<libc::pid_t> {
        fn walk(dir: &Path, out: &mut BTreeSet<libc::pid_t>) {
            if let Ok(data) = fs::read(dir.join("cgroup.procs")) {
                out.extend(parse_pids(&data));
            }
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        let mut pids = BTreeSet::new();
        for d in &self.slot.dirs {
            walk(d, &mut pids);
        }
        pids.remove(&exclude);
        pids.remove(&(std::process::id() as libc::pid_t));
        pids
    }

    /// Fake mode: the killed processes leave every `cgroup.procs` of the tree (fake pids are
    /// never signalled).
    fn fake_exit(&self, exclude: libc::pid_t) {
        fn walk(dir: &Path, exclude: libc::pid_t) {
            let procs = dir.join("cgroup.procs");
            if let Ok(data) = fs::read(&procs) {
                let keep = parse_pids(&data).contains(&exclude);
                let _ = fs::write(
                    &procs,
                    if keep {
                        format!("{exclude}\n")
                    } else {
                        "".into()
                    },
                );
            }
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), exclude);
                }
            }
        }
        self.slot.dirs.iter().for_each(|d| walk(d, exclude));
    }

    /// SIGKILLs every process of the run (its cgroups and nsjail's below them) but `exclude`
    /// (nsjail) until none is left or 2 s have passed; v2 first writes `cgroup.kill` (nsjail
    /// is not in the run's v2 cgroup). Returns how many distinct processes were signalled.
    /// Never fails: what cannot be read counts as empty.
    pub fn kill_except(&self, exclude: libc::pid_t) -> usize {
        if self.slot.version == Version::V2 {
            let _ = self.slot.write_raw(PIDS, c"cgroup.kill", b"1");
        }
        let deadline = Instant::now() + KILL_TIMEOUT;
        let mut signalled = BTreeSet::new();
        loop {
            let left = self.procs(exclude);
            if left.is_empty() || Instant::now() > deadline {
                return signalled.len();
            }
            if self.slot.fake {
                self.fake_exit(exclude);
            } else {
                left.iter().copied().for_each(sigkill);
            }
            signalled.extend(left);
            std::thread::sleep(KILL_PAUSE);
        }
    }

    /// Closes the OOM eventfd and removes the run's cgroups with any left below them
    /// (children first), retrying for up to 2 s while the kernel answers `EBUSY`. Errors
    /// name the first directory that could not be removed.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.oom = None;
        let deadline = Instant::now() + REMOVE_TIMEOUT;
        let mut first_error = None;
        for d in self.slot.dirs.iter().rev() {
            if let Err(e) = remove_tree(d, self.slot.fake, deadline) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Removes cgroup `dir` and every cgroup below it, children first, retrying `rmdir` while
/// it answers `EBUSY` until `deadline`. A missing directory counts as removed.
fn remove_tree(dir: &Path, fake: bool, deadline: Instant) -> Result<(), CgroupError> {
    let mut children: Vec<PathBuf> = Vec::new();
    match fs::read_dir(dir) {
        Ok(rd) => {
            for e in rd.flatten() {
                match e.file_type() {
                    Ok(t) if t.is_dir() => children.push(e.path()),
                    // A fake tree's interface files are plain files.
                    Ok(t) if fake && t.is_file() => {
                        let _ = fs::remove_file(e.path());
                    }
                    _ => {}
                }
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    for child in children {
        remove_tree(&child, fake, deadline)?;
    }
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if errno(&e) == libc::EBUSY && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                return Err(CgroupError::io(
                    format!("cannot remove cgroup {}", dir.display()),
                    e,
                ))
            }
        }
    }
}
