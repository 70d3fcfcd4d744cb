//! Control groups for sandbox slots, on cgroup v2 (unified) or cgroup v1 hosts.
//!
//! A sandbox has N concurrency *slots*. Each slot owns one cgroup (v2) or one cgroup per
//! hierarchy (v1: `memory`, `pids`, `cpuacct`). Cgroups are created once, reused for every run
//! in that slot, and removed when the [`Slot`] is dropped; the private base cgroup that holds
//! the slots is removed once the [`Manager`] and all of its slots are gone. Per-run work is a
//! handful of small reads and writes through directory fds (`openat`), never a directory scan.
//!
//! # Detection
//!
//! * **v2**: the cgroup root (`/sys/fs/cgroup`, injectable with [`Manager::with_root`]) has a
//!   `cgroup.controllers` file, i.e. a pure unified hierarchy is mounted there.
//! * **v1**: otherwise the `memory`, `pids` and `cpuacct` controllers must each be mounted in a
//!   directory below the root, either under their own name or co-mounted (e.g. `cpu,cpuacct`).
//!   A hybrid host (v1 controllers plus an empty `unified` v2 mount) is treated as v1.
//!
//! # Where the base cgroup goes
//!
//! A private base `agentrl-<pid>-<n>` is created; slots are `slot-<index>` below it. The
//! manager holds an exclusive `flock` on each base directory for as long as it owns it. A base
//! left behind by a process that died without cleaning up (killed, or a `Sandbox` never
//! dropped) is removed by the next manager created under the same parent: one whose owner pid
//! is gone from our pid namespace, whose lock nobody holds (so an owner in another pid
//! namespace keeps its own), older than [`STALE_GRACE`] (so a base just made, not yet locked,
//! is never taken) and without processes ([`Manager::remove_stale`]).
//!
//! * v1: under this process's own cgroup in each hierarchy (from `/proc/self/cgroup`), so the
//!   sandbox stays inside any limits that already apply to us (a container's memory limit, …).
//!   v1 has no "no internal processes" rule, so this always works.
//! * v2: under this process's own cgroup as well, so a service's or a container's limits bind
//!   the boxes too. cgroup v2's "no internal processes" rule lets a cgroup enable controllers
//!   for children only while it holds no processes, and ours holds at least this one, so:
//!   a cgroup namespace's root (a container's own cgroup, e.g. Docker's default on v2), a
//!   delegated cgroup (systemd `Delegate=yes`, marked `trusted.delegate`) or a cgroup whose
//!   only process is this one (a service's main process) has its processes moved into its
//!   leaf child `agentrl-host` ([`HOST_LEAF`]), and the base goes beside that leaf; every limit
//!   of the cgroup still applies to all of them. A cgroup that also holds other programs'
//!   processes and is not delegated (a login session's scope) is left alone: the base goes in
//!   its nearest ancestor without processes (e.g. the user's slice), or the true root. Along
//!   the path from the root to the chosen parent, and in the base itself, `+memory +pids`
//!   (required) and `+cpu` (when available) are written to `cgroup.subtree_control` where
//!   missing. Users with a delegated subtree of their own pass it as `parent`; then nothing
//!   is written above it unless a controller is missing there.
//!
//! If the own-cgroup path from `/proc/self/cgroup` is not visible under the mount (a container
//! without a cgroup namespace that bind-mounts its subtree), the mount's root from
//! `/proc/self/mountinfo` is stripped from it; failing that, the visible top of the mount is
//! used.
//!
//! # What is reset per run ([`Slot::prepare_run`])
//!
//! * The peak memory watermark: v1 writes `0` to `memory.max_usage_in_bytes`; v2 writes to
//!   `memory.peak` through an fd kept open for the slot's lifetime (on Linux 6.12+ that reset is
//!   local to the fd, which is why it is kept open). Both resets set the watermark to the
//!   *current* usage, so memory still charged from earlier runs (page cache, tmpfs files) counts.
//! * Baselines of the CPU time, the OOM-kill counter and the pids `max` event counter, so that
//!   [`Slot::cpu_time_ns`] and [`Slot::usage`] report per-run figures.
//!
//! # Exactness of the per-run figures
//!
//! | figure | v1 | v2 |
//! |---|---|---|
//! | `cpu_time_ns` | exact (`cpuacct.usage`, ns; may lag a running task by one tick) | exact (`cpu.stat usage_usec`, µs) |
//! | `peak_memory_bytes` | exact | 6.12+: exact. 5.19–6.11 (`memory.peak` not resettable): exact only when the run raised the slot's lifetime peak, else the largest [`Slot::sample_memory`] value (a lower bound, `peak_memory_exact == false`) or `None`; a cgroup made for one run ([`Manager::create_run_cgroup`], which the sandbox gives its cold runs there) is exact. Before 5.19: samples only |
//! | `oom_killed` | 4.13+: `memory.oom_control` `oom_kill` rose (exact); older: `memory.failcnt` rose, i.e. the limit was *hit* (may be true without a kill) | `memory.events` `oom_kill` rose (exact) |
//! | `pids_limit_hit` | `pids.events` `max` rose (false if the file is absent) | `pids.events` `max` rose |
//!
//! All figures assume only one run uses a slot at a time and that no process from an earlier
//! run is left in it (call [`Slot::kill_all`] between runs).
//!
//! # Costs
//!
//! Each slot keeps open its directory fd(s) and the counter files read every run: v1 holds 7
//! fds (3 directories, `cpuacct.usage`, `memory.max_usage_in_bytes`, `memory.oom_control`,
//! `pids.events`), v2 holds 5 (directory, `cpu.stat`, `memory.peak`, `memory.events`,
//! `pids.events`); raise `RLIMIT_NOFILE` if you run very many slots. `cgroup.procs` is opened
//! per read on purpose: v1 caches its pid list per open file for about a second. Measured on a
//! v1 host: `prepare_run` ≈ 8 µs, `usage` ≈ 7 µs, `cpu_time_ns` ≈ 2 µs, `process_count` and
//! an empty `kill_all` ≈ 7 µs, `set_limits` with unchanged values: no system call.
//!
//! # Fake trees
//!
//! When the root given to [`Manager::with_root`] is not a cgroup filesystem (checked with
//! `statfs`), the manager runs in *fake* mode for tests: after creating a directory it writes the
//! interface files the kernel would have created (with default contents), writes truncate the
//! file, a `memory.peak` reset writes `0`, removal deletes those files first, and
//! [`Slot::kill_all`] never signals the (fake) pids it finds but empties `cgroup.procs`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::retry;

/// Where cgroup file systems are mounted on a normal host.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";

/// Prefix of the private base cgroup's name: `agentrl-<pid>-<n>`.
const BASE_PREFIX: &str = "agentrl-";

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

/// Per-run resource figures, see the module docs for their exactness.
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

// ---------------------------------------------------------------------------------------------
// Low-level file helpers.

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

/// Opens directory `path` and takes an exclusive `flock` on it without waiting: `Ok(None)`
/// when another open file holds it. The lock lasts as long as the returned fd (and dies with
/// the process).
fn try_lock_dir(path: &Path) -> io::Result<Option<OwnedFd>> {
    let fd = open_dir(path)?;
    loop {
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(fd));
        }
        let e = io::Error::last_os_error();
        match errno(&e) {
            libc::EINTR => continue,
            libc::EWOULDBLOCK => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// `openat(dir, name, flags | O_CLOEXEC)`, retried on `EINTR`.
fn open_at(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<File> {
    loop {
        // SAFETY: `name` is a NUL-terminated string that outlives the call and `dir` is an open
        // descriptor borrowed for the duration of the call.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOCTTY,
            )
        };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by `openat`, is valid and owned by nobody else.
            return Ok(unsafe { File::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reads a whole small file from offset 0 into `buf` (cgroup files regenerate on a read at 0).
fn read_into<'a>(file: &File, buf: &'a mut [u8]) -> io::Result<&'a [u8]> {
    let mut n = 0;
    loop {
        if n == buf.len() {
            return Err(io::Error::new(
                ErrorKind::InvalidData,
                "file is larger than expected",
            ));
        }
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => return Ok(&buf[..n]),
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads a whole file of any size from offset 0.
fn read_vec(file: &File) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == out.len() {
            out.resize(n * 2, 0);
        }
        match file.read_at(&mut out[n..], n as u64) {
            Ok(0) => {
                out.truncate(n);
                return Ok(out);
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes `data` with one `pwrite` at offset 0 (cgroup files must get a value in one write).
/// In fake mode the file is then truncated to the written length.
fn write_once(file: &File, data: &[u8], fake: bool) -> io::Result<()> {
    loop {
        match file.write_at(data, 0) {
            Ok(n) if n == data.len() => break,
            Ok(n) => {
                return Err(io::Error::new(
                    ErrorKind::WriteZero,
                    format!("short write ({n} of {} bytes)", data.len()),
                ))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if fake {
        file.set_len(data.len() as u64)?;
    }
    Ok(())
}

fn write_path(path: &Path, data: &str, fake: bool) -> io::Result<()> {
    let f = OpenOptions::new().write(true).truncate(fake).open(path)?;
    write_once(&f, data.as_bytes(), fake)
}

fn read_path(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path)
        .map_err(|e| CgroupError::io(format!("cannot read {}", path.display()), e))
}

fn parse_u64(data: &[u8]) -> Option<u64> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

/// Value of the `key value` line named `key` in a flat-keyed cgroup file.
fn keyed_u64(data: &[u8], key: &str) -> Option<u64> {
    std::str::from_utf8(data).ok()?.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        if it.next()? == key {
            it.next()?.parse().ok()
        } else {
            None
        }
    })
}

fn parse_pids(data: &[u8]) -> Vec<libc::pid_t> {
    std::str::from_utf8(data)
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Formats `v` in decimal into `buf` without allocating.
fn fmt_u64(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

fn limit_string(limit: Option<u64>, unlimited: &str) -> String {
    limit.map_or_else(|| unlimited.to_string(), |v| v.to_string())
}

fn is_cgroupfs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable memory large enough for
    // a `struct statfs`.
    let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return false;
    }
    // SAFETY: `statfs` returned 0, so it filled in `st`.
    let st = unsafe { st.assume_init() };
    let t = st.f_type as u64;
    t == CGROUP_SUPER_MAGIC || t == CGROUP2_SUPER_MAGIC
}

fn sigkill(pid: libc::pid_t) {
    if pid <= 0 || pid as u32 == std::process::id() {
        return;
    }
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

fn pid_alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence; no memory is involved.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

// ---------------------------------------------------------------------------------------------
// Fake trees (tests).

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
fn fake_populate(dir: &Path, version: Version) -> io::Result<()> {
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

// ---------------------------------------------------------------------------------------------
// Directory removal.

/// Removes one cgroup directory, retrying while the kernel answers `EBUSY`. A missing directory
/// counts as removed.
fn remove_cgroup_dir(path: &Path, fake: bool) -> io::Result<()> {
    if fake {
        if let Ok(entries) = fs::read_dir(path) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    match retry::while_busy(RMDIR_TIMEOUT, || fs::remove_dir(path)) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Whether `dir` or a cgroup below it holds a process (or cannot be read).
fn tree_has_processes(dir: &Path) -> bool {
    if has_processes(dir).unwrap_or(true) {
        return true;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return true;
    };
    entries
        .flatten()
        .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && tree_has_processes(&e.path()))
}

/// Removes `dir` and every cgroup below it, depth first. With `kill`, processes found in each
/// cgroup are SIGKILLed first (never in fake mode). Returns whether `dir` is gone.
fn remove_tree(dir: &Path, fake: bool, kill: bool) -> bool {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path(), fake, kill);
            }
        }
    }
    if kill && !fake {
        let deadline = Instant::now() + KILL_TIMEOUT;
        let mut pause = retry::FIRST_PAUSE;
        loop {
            let me = std::process::id() as libc::pid_t;
            let mut pids = fs::read(dir.join("cgroup.procs"))
                .map(|d| parse_pids(&d))
                .unwrap_or_default();
            pids.retain(|&p| p != me);
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            pids.into_iter().for_each(sigkill);
            retry::backoff(&mut pause);
        }
    }
    remove_cgroup_dir(dir, fake).is_ok()
}

/// The private base cgroup directories (one per hierarchy). Shared by the [`Manager`] and its
/// slots, so that it is removed only after every slot is gone, whatever the drop order.
#[derive(Debug)]
struct BaseDirs {
    dirs: Vec<PathBuf>,
    fake: bool,
    /// The `flock`s that mark the base as owned (released after the removal in `drop`).
    _locks: Vec<OwnedFd>,
}

impl Drop for BaseDirs {
    fn drop(&mut self) {
        for d in &self.dirs {
            if remove_cgroup_dir(d, self.fake).is_err() {
                // Leaked slots (e.g. `mem::forget`): kill and remove whatever is below.
                remove_tree(d, self.fake, true);
            }
        }
    }
}

/// Removes directories created so far unless disarmed.
struct DirGuard {
    dirs: Vec<PathBuf>,
    fake: bool,
}

impl DirGuard {
    fn disarm(mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.dirs)
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            let _ = remove_cgroup_dir(d, self.fake);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery.

/// This process's cgroup path in the unified hierarchy (`ctrl == None`, line `0::<path>`) or in
/// the v1 hierarchy that carries `ctrl`, from the text of `/proc/self/cgroup`.
fn own_cgroup<'a>(self_cgroup: &'a str, ctrl: Option<&str>) -> Option<&'a str> {
    self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match ctrl {
            None => id == "0" && ctrls.is_empty(),
            Some(c) => ctrls.split(',').any(|x| x == c),
        };
        hit.then_some(path)
    })
}

/// The root (4th field) of the mount at `mount_point`, from the text of `/proc/self/mountinfo`.
fn mount_root_of(mountinfo: &str, mount_point: &Path) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            (f.len() > 4 && Path::new(f[4]) == mount_point).then(|| PathBuf::from(f[3]))
        })
        .next_back()
}

/// Resolves a cgroup path `rel` (as in `/proc/self/cgroup`) to a directory under `mount`.
fn resolve_own(mount: &Path, rel: &str, mountinfo: &dyn Fn() -> String) -> PathBuf {
    let direct = mount.join(rel.trim_start_matches('/'));
    if direct.is_dir() {
        return direct;
    }
    let canon = fs::canonicalize(mount).unwrap_or_else(|_| mount.to_path_buf());
    if let Some(mroot) = mount_root_of(&mountinfo(), &canon) {
        if let Ok(rest) = Path::new(rel).strip_prefix(&mroot) {
            let p = mount.join(rest);
            if p.is_dir() {
                return p;
            }
        }
    }
    mount.to_path_buf()
}

/// Finds the v1 hierarchy carrying `ctrl` below `root`: `root/<ctrl>` or a co-mounted
/// directory such as `root/cpu,cpuacct`.
fn find_v1_mount(root: &Path, ctrl: &str) -> Option<PathBuf> {
    let direct = root.join(ctrl);
    if direct.join("cgroup.procs").is_file() {
        return Some(direct);
    }
    for e in fs::read_dir(root).ok()?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.split(',').any(|c| c == ctrl) && e.path().join("cgroup.procs").is_file() {
            return Some(e.path());
        }
    }
    None
}

fn has_processes(dir: &Path) -> Result<bool, CgroupError> {
    Ok(read_path(&dir.join("cgroup.procs"))?
        .split_whitespace()
        .next()
        .is_some())
}

/// Where the base goes on v2 when no parent is given (see the module docs).
#[derive(Debug, PartialEq)]
enum Placement {
    /// In this cgroup (our own, emptied into [`HOST_LEAF`] where needed, or the true root).
    Here(PathBuf),
    /// Our own cgroup `own` holds processes we may not move: its nearest ancestor `dir`
    /// without processes.
    Ancestor { own: PathBuf, dir: PathBuf },
}

/// Whether `dir` is the true root of the hierarchy (exempt from the "no internal processes"
/// rule). The root of a cgroup namespace, as a container sees its own cgroup, is not: only
/// non-root cgroups have a `cgroup.type` file.
fn is_true_root(root: &Path, dir: &Path) -> bool {
    dir == root && !dir.join("cgroup.type").exists()
}

/// Whether the cgroup `dir` was delegated to its processes: systemd (251+) marks the cgroup
/// of a unit with `Delegate=yes` with the extended attribute `trusted.delegate` (or
/// `user.delegate` for a user manager) set to `1`.
fn is_delegated(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    [c"trusted.delegate", c"user.delegate"].iter().any(|name| {
        let mut v = [0u8; 8];
        // SAFETY: `path` and `name` are NUL-terminated; `v` is a writable buffer of the
        // length passed.
        let n =
            unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        n > 0 && v[..n as usize].starts_with(b"1")
    })
}

/// Moves every process of v2 cgroup `dir` into its leaf child [`HOST_LEAF`] (made if missing),
/// so that `dir` may enable controllers for new children of its own. The processes stay
/// inside `dir`'s subtree, so every limit that applied to them still does. Retries while
/// processes keep arriving (forks during the move), within a bound.
fn evacuate(dir: &Path, fake: bool) -> Result<(), CgroupError> {
    let leaf = dir.join(HOST_LEAF);
    match fs::create_dir(&leaf) {
        Ok(()) if fake => fake_populate(&leaf, Version::V2).map_err(|e| {
            CgroupError::io(format!("cannot populate fake cgroup {}", leaf.display()), e)
        })?,
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(CgroupError::io(
                format!(
                    "cannot create cgroup {} to move this process's cgroup's processes into",
                    leaf.display()
                ),
                e,
            ))
        }
    }
    let procs = leaf.join("cgroup.procs");
    for _ in 0..100 {
        let pids = parse_pids(read_path(&dir.join("cgroup.procs"))?.as_bytes());
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            match write_path(&procs, &pid.to_string(), false) {
                Ok(()) => {}
                Err(e) if errno(&e) == libc::ESRCH => {} // it exited meanwhile
                Err(e) => {
                    return Err(CgroupError::io(
                        format!("cannot move process {pid} into {}", procs.display()),
                        e,
                    ))
                }
            }
        }
        if fake {
            // The kernel moves them; a fake tree only records the writes.
            write_path(&dir.join("cgroup.procs"), "", true)
                .map_err(|e| CgroupError::io("cannot empty a fake cgroup.procs", e))?;
        }
    }
    Err(CgroupError::msg(format!(
        "processes keep appearing in {} while moving them into {}",
        dir.display(),
        leaf.display()
    )))
}

/// Where the base goes on v2 without an explicit parent. Our own cgroup `own` keeps the
/// sandbox inside every limit that applies to us, but cgroup v2's "no internal processes"
/// rule lets a cgroup enable controllers for children only while it has no processes:
///
/// 1. `own` without processes (e.g. our [`HOST_LEAF`]'s parent, once emptied), or the true
///    root: `own`.
/// 2. `own` is ours to rearrange: a cgroup namespace's root (a container's own cgroup), a
///    delegated cgroup (systemd `Delegate=yes`), or one whose only process is this one (a
///    service's main process): its processes move into `own/agentrl-host`, then `own`.
/// 3. Otherwise (other programs' processes in a cgroup not delegated to us, as a login
///    session's scope): the nearest ancestor without processes, which keeps the sandbox
///    inside the ancestors' limits (not `own`'s).
fn default_v2_parent(
    root: &Path,
    own: PathBuf,
    me: libc::pid_t,
    fake: bool,
) -> Result<Placement, CgroupError> {
    // A process of ours moved into the leaf earlier: the cgroup to use is its parent.
    let own = match (own.file_name(), own.parent()) {
        (Some(n), Some(p)) if own != root && n == HOST_LEAF => p.to_path_buf(),
        _ => own,
    };
    if is_true_root(root, &own) || !has_processes(&own)? {
        return Ok(Placement::Here(own));
    }
    let pids = parse_pids(read_path(&own.join("cgroup.procs"))?.as_bytes());
    if own == root || is_delegated(&own) || pids == [me] {
        evacuate(&own, fake)?;
        return Ok(Placement::Here(own));
    }
    let mut dir = own.clone();
    while dir != root && dir.pop() {
        if is_true_root(root, &dir) || !has_processes(&dir)? {
            return Ok(Placement::Ancestor { own, dir });
        }
        if dir == root {
            // A container's root (a cgroup namespace) with processes: the container is ours.
            evacuate(&dir, fake)?;
            return Ok(Placement::Ancestor { own, dir });
        }
    }
    Err(CgroupError::msg(format!(
        "cgroup {} is not below the cgroup v2 mount {}",
        own.display(),
        root.display()
    )))
}

/// Makes sure the children of v2 cgroup `dir` get the required (and available optional)
/// controllers, writing `cgroup.subtree_control` only where something is missing.
fn ensure_controllers(dir: &Path, fake: bool) -> Result<(), CgroupError> {
    let avail_text = read_path(&dir.join("cgroup.controllers"))?;
    let avail: Vec<&str> = avail_text.split_whitespace().collect();
    for r in V2_REQUIRED {
        if !avail.contains(&r) {
            return Err(CgroupError::msg(format!(
                "cgroup v2 controller '{r}' is not available in {} (available: '{}'); it may be \
                 bound to a cgroup v1 hierarchy, or not delegated to this subtree",
                dir.join("cgroup.controllers").display(),
                avail_text.trim()
            )));
        }
    }
    let control = dir.join("cgroup.subtree_control");
    let enabled_text = read_path(&control)?;
    let enabled: Vec<&str> = enabled_text
        .split_whitespace()
        .map(|c| c.trim_start_matches('+'))
        .collect();
    let missing_req: Vec<&str> = V2_REQUIRED
        .into_iter()
        .filter(|c| !enabled.contains(c))
        .collect();
    let missing_opt: Vec<&str> = V2_OPTIONAL
        .into_iter()
        .filter(|c| avail.contains(c) && !enabled.contains(c))
        .collect();
    let write = |list: &[&str]| {
        // A fake file does not accumulate like the kernel's, so write the union there.
        let keep: &[&str] = if fake { &enabled } else { &[] };
        let text: Vec<String> = keep.iter().chain(list).map(|c| format!("+{c}")).collect();
        write_path(&control, &text.join(" "), fake)
    };
    let all: Vec<&str> = missing_req.iter().chain(&missing_opt).copied().collect();
    if all.is_empty() {
        return Ok(());
    }
    let result = match write(&all) {
        Err(_) if !missing_opt.is_empty() && missing_req.is_empty() => Ok(()),
        Err(_) if !missing_opt.is_empty() => write(&missing_req),
        r => r,
    };
    result.map_err(|e| {
        let why = match errno(&e) {
            libc::EBUSY => {
                "the cgroup has processes, and cgroup v2 forbids enabling controllers for the \
                 children of a cgroup with processes ('no internal processes' rule); pass a \
                 parent cgroup without processes (e.g. a delegated subtree)"
            }
            libc::EACCES | libc::EPERM | libc::EROFS => {
                "it is not writable by this process; run as root or pass a delegated parent"
            }
            _ => "the kernel refused the write",
        };
        let wanted: Vec<String> = all.iter().map(|c| format!("+{c}")).collect();
        CgroupError::io(
            format!(
                "cannot enable '{}' in {}: {why}",
                wanted.join(" "),
                control.display()
            ),
            e,
        )
    })
}

/// Creates `agentrl-<pid>-<n>` under every parent (same name in each), picking a fresh `n`
/// when the name is taken.
fn make_base(parents: &[PathBuf], fake: bool, version: Version) -> Result<BaseDirs, CgroupError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{BASE_PREFIX}{}-{n}", std::process::id());
        let mut guard = DirGuard {
            dirs: Vec::new(),
            fake,
        };
        let mut taken = false;
        let mut locks = Vec::new();
        for p in parents {
            let d = p.join(&name);
            match fs::create_dir(&d) {
                Ok(()) => guard.dirs.push(d.clone()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    taken = true;
                    break;
                }
                Err(e) => {
                    return Err(CgroupError::io(
                        format!("cannot create cgroup directory {}", d.display()),
                        e,
                    ))
                }
            }
            // Ours from here on: a manager reaping stale bases leaves a locked one alone.
            // (A file system without flock leaves it unlocked, and a reaper unable to lock
            // it leaves it alone as well.)
            match try_lock_dir(&d) {
                Ok(Some(fd)) => locks.push(fd),
                Ok(None) => {
                    return Err(CgroupError::msg(format!(
                        "the new cgroup {} is locked by another process",
                        d.display()
                    )))
                }
                Err(_) => {}
            }
            if fake {
                fake_populate(&d, version).map_err(|e| {
                    CgroupError::io(format!("cannot populate fake cgroup {}", d.display()), e)
                })?;
            }
        }
        if !taken {
            return Ok(BaseDirs {
                dirs: guard.disarm(),
                fake,
                _locks: locks,
            });
        }
    }
    Err(CgroupError::msg(format!(
        "cannot find a free base cgroup name under {}",
        parents[0].display()
    )))
}

/// This process's own v2 cgroup (from the text of `/proc/self/cgroup`) and where the base goes
/// without an explicit parent ([`default_v2_parent`]).
fn own_v2_placement(
    root: &Path,
    self_cgroup: &str,
    mountinfo: &dyn Fn() -> String,
    fake: bool,
) -> Result<Placement, CgroupError> {
    let rel = own_cgroup(self_cgroup, None).ok_or_else(|| {
        CgroupError::msg(
            "/proc/self/cgroup has no cgroup v2 entry ('0::<path>'); is this process in the \
             unified hierarchy?",
        )
    })?;
    let own = resolve_own(root, rel, mountinfo);
    default_v2_parent(root, own, std::process::id() as libc::pid_t, fake)
}

fn read_self_cgroup() -> Result<String, CgroupError> {
    fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| CgroupError::io("cannot read /proc/self/cgroup", e))
}

fn read_mountinfo() -> String {
    fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
}

/// On a cgroup v2 host, the cgroup in which a sandbox's base goes when no parent is given (see
/// the module docs; this may move our cgroup's processes into [`HOST_LEAF`]). `None` on a v1 or
/// hybrid host. For other managers of cgroups (the nsjail backend), so that every backend
/// places its cgroups alike.
pub fn default_v2_parent_dir() -> Result<Option<PathBuf>, CgroupError> {
    let root = Path::new(DEFAULT_ROOT);
    if !root.join("cgroup.controllers").is_file() {
        return Ok(None);
    }
    let placement = own_v2_placement(
        root,
        &read_self_cgroup()?,
        &read_mountinfo,
        !is_cgroupfs(root),
    )?;
    Ok(Some(match placement {
        Placement::Here(d) | Placement::Ancestor { dir: d, .. } => d,
    }))
}

// ---------------------------------------------------------------------------------------------
// Manager.

/// Owns the private base cgroup and creates [`Slot`]s below it.
///
/// The base directories are removed when the manager *and* all slots it created have been
/// dropped (slots keep the base alive), so drop order does not matter; removal never panics.
#[derive(Debug)]
pub struct Manager {
    version: Version,
    fake: bool,
    /// Parent directory of the base, one per hierarchy (v2: one).
    parents: Vec<PathBuf>,
    base: Arc<BaseDirs>,
    /// Hierarchy index (into `parents` / `base.dirs`) per controller `[memory, pids, cpuacct]`.
    ctl: [usize; 3],
}

impl Manager {
    /// Detects v2 (pure unified at `/sys/fs/cgroup`) or v1 (`memory`, `pids` and `cpuacct`
    /// mounted), and creates the private base cgroup `agentrl-<pid>-<n>` as described in the
    /// module docs. `parent` overrides where the base goes: on v2 a cgroup directory (absolute,
    /// or relative to the root); on v1 a path relative to each controller's mount, or an
    /// absolute path inside one of them (its relative part is used for all).
    pub fn new(parent: Option<&Path>) -> Result<Manager, CgroupError> {
        Self::with_root(Path::new(DEFAULT_ROOT), parent)
    }

    /// [`Manager::new`] with another cgroup root, e.g. a fake tree for tests (see the module
    /// docs on fake mode).
    pub fn with_root(root: &Path, parent: Option<&Path>) -> Result<Manager, CgroupError> {
        let m = Self::build(root, parent, &read_self_cgroup()?, &read_mountinfo)?;
        m.remove_stale();
        Ok(m)
    }

    fn build(
        root: &Path,
        parent: Option<&Path>,
        self_cgroup: &str,
        mountinfo: &dyn Fn() -> String,
    ) -> Result<Manager, CgroupError> {
        if root.join("cgroup.controllers").is_file() {
            Self::build_v2(root, parent, self_cgroup, mountinfo)
        } else {
            Self::build_v1(root, parent, self_cgroup, mountinfo)
        }
    }

    fn build_v2(
        root: &Path,
        parent: Option<&Path>,
        self_cgroup: &str,
        mountinfo: &dyn Fn() -> String,
    ) -> Result<Manager, CgroupError> {
        let fake = !is_cgroupfs(root);
        let mut fallback_from = None;
        let parent_dir = match parent {
            Some(p) => {
                let p = if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    root.join(p)
                };
                if !p.join("cgroup.procs").is_file() {
                    return Err(CgroupError::msg(format!(
                        "cgroup parent {} is not a cgroup v2 directory (no cgroup.procs)",
                        p.display()
                    )));
                }
                p
            }
            None => match own_v2_placement(root, self_cgroup, mountinfo, fake)? {
                Placement::Here(dir) => dir,
                Placement::Ancestor { own, dir } => {
                    fallback_from = Some(own);
                    dir
                }
            },
        };
        Self::setup_v2(root, parent_dir.clone(), fake).map_err(|mut e| {
            if let Some(own) = fallback_from {
                e.what = format!(
                    "this process's cgroup {} also holds other processes and is not delegated, \
                     so the sandbox goes in its nearest ancestor without processes, {}; that \
                     failed: {} (pass cgroup_parent; see docs/deployment.md)",
                    own.display(),
                    parent_dir.display(),
                    e.what
                );
            }
            e
        })
    }

    fn setup_v2(root: &Path, parent_dir: PathBuf, fake: bool) -> Result<Manager, CgroupError> {
        // Enable controllers along the path root ..= parent_dir.
        let canon = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let (croot, cparent) = (canon(root), canon(&parent_dir));
        let rest = cparent.strip_prefix(&croot).map_err(|_| {
            CgroupError::msg(format!(
                "cgroup parent {} is not inside the cgroup v2 hierarchy at {}",
                parent_dir.display(),
                root.display()
            ))
        })?;
        let mut dir = croot.clone();
        ensure_controllers(&dir, fake)?;
        for c in rest.components() {
            dir.push(c);
            ensure_controllers(&dir, fake)?;
        }
        let base = Arc::new(make_base(
            std::slice::from_ref(&parent_dir),
            fake,
            Version::V2,
        )?);
        ensure_controllers(&base.dirs[0], fake)?;
        Ok(Manager {
            version: Version::V2,
            fake,
            parents: vec![parent_dir],
            base,
            ctl: [0; 3],
        })
    }

    fn build_v1(
        root: &Path,
        parent: Option<&Path>,
        self_cgroup: &str,
        mountinfo: &dyn Fn() -> String,
    ) -> Result<Manager, CgroupError> {
        // Unique hierarchies (mount dir, first controller found in it) and controller mapping.
        let mut mounts: Vec<(PathBuf, PathBuf, &str)> = Vec::new(); // (mount, canonical, ctrl)
        let mut ctl = [0usize; 3];
        for (i, c) in V1_CONTROLLERS.into_iter().enumerate() {
            let m = find_v1_mount(root, c).ok_or_else(|| {
                CgroupError::msg(format!(
                    "cgroup v1 controller '{c}' is not mounted (looked for {} or a co-mounted \
                     directory such as 'cpu,cpuacct'), and {} is not a cgroup v2 hierarchy (no \
                     cgroup.controllers)",
                    root.join(c).display(),
                    root.display()
                ))
            })?;
            let cm = fs::canonicalize(&m).unwrap_or_else(|_| m.clone());
            ctl[i] = match mounts.iter().position(|(_, k, _)| *k == cm) {
                Some(j) => j,
                None => {
                    mounts.push((m, cm, c));
                    mounts.len() - 1
                }
            };
        }
        let fake = !is_cgroupfs(&mounts[0].0);
        let mut parents = Vec::new();
        for (mount, _, ctrl) in &mounts {
            let p = match parent {
                Some(p) if p.is_relative() => mount.join(p),
                Some(p) => {
                    let rel = mounts
                        .iter()
                        .find_map(|(m, _, _)| p.strip_prefix(m).ok())
                        .ok_or_else(|| {
                            CgroupError::msg(format!(
                                "cgroup parent {} is not inside any of the v1 hierarchies {:?}",
                                p.display(),
                                mounts.iter().map(|m| &m.0).collect::<Vec<_>>()
                            ))
                        })?;
                    mount.join(rel)
                }
                None => {
                    let rel = own_cgroup(self_cgroup, Some(ctrl)).unwrap_or("/");
                    resolve_own(mount, rel, mountinfo)
                }
            };
            if !p.join("cgroup.procs").is_file() {
                return Err(CgroupError::msg(format!(
                    "cgroup parent {} is not a cgroup v1 directory (no cgroup.procs)",
                    p.display()
                )));
            }
            parents.push(p);
        }
        let base = make_base(&parents, fake, Version::V1)?;
        Ok(Manager {
            version: Version::V1,
            fake,
            parents,
            base: Arc::new(base),
            ctl,
        })
    }

    /// The cgroup version in use.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The private base cgroup directories (v2: one; v1: one per distinct hierarchy).
    pub fn base_dirs(&self) -> &[PathBuf] {
        &self.base.dirs
    }

    /// Removes base cgroups `agentrl-<pid>-<n>` (with the slots below them) left next to ours
    /// by processes that died without removing them: the owner pid is gone from our pid
    /// namespace, nobody holds the base's lock (a live owner in another pid namespace does),
    /// and it is older than [`STALE_GRACE`]. Cgroups that still contain processes are left
    /// alone (nothing is killed). Returns how many base directories were removed. Called once
    /// when a manager is created.
    pub fn remove_stale(&self) -> usize {
        self.remove_stale_older_than(STALE_GRACE)
    }

    fn remove_stale_older_than(&self, grace: Duration) -> usize {
        let me = std::process::id();
        let mut removed = 0;
        for parent in &self.parents {
            let Ok(entries) = fs::read_dir(parent) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix(BASE_PREFIX))
                    .and_then(|n| n.split_once('-'))
                    .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
                else {
                    continue;
                };
                if pid as u32 == me || pid_alive(pid) {
                    continue;
                }
                let Ok(meta) = e.metadata() else { continue };
                let young = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| age < grace);
                if !meta.is_dir() || young {
                    continue;
                }
                // Held while removing: a stale base is ours alone, and an owner still alive
                // elsewhere keeps it.
                let Ok(Some(_lock)) = try_lock_dir(&e.path()) else {
                    continue;
                };
                if !tree_has_processes(&e.path()) && remove_tree(&e.path(), self.fake, false) {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Creates the cgroup(s) of slot `index` (`slot-<index>` under the base). Fails if that
    /// slot already exists. The new slot has no limits and a fresh per-run baseline.
    pub fn create_slot(&self, index: usize) -> Result<Slot, CgroupError> {
        self.create(format!("slot-{index}"), index)
    }

    /// Creates a fresh cgroup for one run of slot `index` (`slot-<index>-run` beside the
    /// slot's own), removed when the returned [`Slot`] is dropped. For cgroup v2 kernels whose
    /// `memory.peak` cannot be reset ([`PeakMemory::LifetimeOnly`], Linux 5.19–6.11): the
    /// lifetime peak of a cgroup made for the run is the run's exact peak. A run of a slot
    /// that is not in the slot's own cgroup is not charged the slot's warm interpreter, so
    /// its limits need no baseline. One that an earlier run left (its removal timed out) is
    /// killed and removed first.
    pub fn create_run_cgroup(&self, index: usize) -> Result<Slot, CgroupError> {
        let name = format!("slot-{index}-run");
        for base in &self.base.dirs {
            let d = base.join(&name);
            if d.exists() {
                remove_tree(&d, self.fake, true);
            }
        }
        self.create(name, index)
    }

    fn create(&self, name: String, index: usize) -> Result<Slot, CgroupError> {
        let fake = self.fake;
        let mut guard = DirGuard {
            dirs: Vec::new(),
            fake,
        };
        let mut fds = Vec::new();
        for base in &self.base.dirs {
            let d = base.join(&name);
            fs::create_dir(&d).map_err(|e| {
                let what = if e.kind() == ErrorKind::AlreadyExists {
                    format!("cgroup {name} already exists ({})", d.display())
                } else {
                    format!("cannot create cgroup directory {}", d.display())
                };
                CgroupError::io(what, e)
            })?;
            guard.dirs.push(d.clone());
            if fake {
                fake_populate(&d, self.version).map_err(|e| {
                    CgroupError::io(format!("cannot populate fake cgroup {}", d.display()), e)
                })?;
            }
            fds.push(
                open_dir(&d)
                    .map_err(|e| CgroupError::io(format!("cannot open {}", d.display()), e))?,
            );
        }
        let dirs = &guard.dirs;
        let fd = |c: usize| fds[self.ctl[c]].as_fd();
        let path = |c: usize, f: &str| dirs[self.ctl[c]].join(f);
        let exists = |c: usize, f: &str| path(c, f).exists();
        let open = |c: usize, f: &CStr, flags| {
            open_at(fd(c), f, flags).map_err(|e| {
                CgroupError::io(
                    format!("cannot open {}", path(c, &f.to_string_lossy()).display()),
                    e,
                )
            })
        };

        let peak_file;
        let peak_mode;
        let (cpu_file, has_memsw, oom_source) = match self.version {
            Version::V2 => {
                match open_at(fd(MEM), c"memory.swap.max", libc::O_WRONLY) {
                    Ok(f) => write_once(&f, b"0", fake).map_err(|e| {
                        CgroupError::io(
                            format!(
                                "cannot write '0' to {}",
                                path(MEM, "memory.swap.max").display()
                            ),
                            e,
                        )
                    })?,
                    Err(e) if e.kind() == ErrorKind::NotFound => {} // no swap accounting
                    Err(e) => {
                        return Err(CgroupError::io(
                            format!("cannot open {}", path(MEM, "memory.swap.max").display()),
                            e,
                        ))
                    }
                }
                (peak_file, peak_mode) = probe_v2_peak(fd(MEM), fake);
                (open(CPU, c"cpu.stat", libc::O_RDONLY)?, false, OOM_V2)
            }
            Version::V1 => {
                peak_file = Some(open(MEM, c"memory.max_usage_in_bytes", libc::O_RDWR)?);
                peak_mode = PeakMemory::PerRun;
                let oom = read_path(&path(MEM, "memory.oom_control"))?;
                (
                    open(CPU, c"cpuacct.usage", libc::O_RDONLY)?,
                    exists(MEM, "memory.memsw.limit_in_bytes"),
                    if keyed_u64(oom.as_bytes(), "oom_kill").is_some() {
                        OOM_V1
                    } else {
                        OOM_V1_FAILCNT
                    },
                )
            }
        };
        let oom_file = open(MEM, oom_source.0, libc::O_RDONLY)?;
        let pids_events_file = match open_at(fd(PIDS), c"pids.events", libc::O_RDONLY) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                return Err(CgroupError::io(
                    format!("cannot open {}", path(PIDS, "pids.events").display()),
                    e,
                ))
            }
        };
        let has_kill =
            self.version == Version::V2 && exists(MEM, "cgroup.kill") && !hidden("cgroup.kill");
        let mut slot = Slot {
            version: self.version,
            fake,
            index,
            dirs: guard.disarm(),
            fds,
            ctl: self.ctl,
            cpu_file,
            peak_file,
            peak_mode,
            has_memsw,
            oom_source,
            oom_file,
            pids_events_file,
            has_kill,
            mem_limit: Some(None),
            pids_limit: Some(None),
            baseline: Baseline::default(),
            sampled_peak: AtomicU64::new(0),
            _base: Arc::clone(&self.base),
        };
        slot.prepare_run()?;
        Ok(slot)
    }
}

/// Which file holds the OOM-kill counter, and the key of its line (`None`: the whole file).
type OomSource = (&'static CStr, Option<&'static str>);
const OOM_V2: OomSource = (c"memory.events", Some("oom_kill"));
const OOM_V1: OomSource = (c"memory.oom_control", Some("oom_kill"));
/// Kernels before 4.13 have no `oom_kill` line: count limit hits instead.
const OOM_V1_FAILCNT: OomSource = (c"memory.failcnt", None);

/// The environment variable that makes the manager act as on an older kernel (see
/// [`hidden`]).
pub const HIDE_ENV: &str = "AGENTRL_CGROUP_HIDE";

/// Whether the kernel feature `name` is to be treated as absent: `AGENTRL_CGROUP_HIDE` is a
/// comma-separated list of `memory.peak` (Linux 5.14-5.18: no peak counter, per-run figures
/// sampled), `memory.peak.reset` (5.19-6.11: a lifetime counter only) and `cgroup.kill`
/// (5.12-5.13: killing by signals to `cgroup.procs`). It lets the fallbacks for kernels the
/// test matrix cannot boot run on one it can (`.ci/guest-matrix`); a feature that is absent
/// stays absent. Read once per process.
pub fn hidden(name: &str) -> bool {
    static HIDDEN: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    HIDDEN
        .get_or_init(|| {
            std::env::var(HIDE_ENV)
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .iter()
        .any(|h| h == name)
}

/// Opens v2 `memory.peak` read-write and checks whether a write resets it (Linux 6.12+).
fn probe_v2_peak(dir: BorrowedFd<'_>, fake: bool) -> (Option<File>, PeakMemory) {
    if hidden("memory.peak") {
        return (None, PeakMemory::Unavailable);
    }
    match open_at(dir, c"memory.peak", libc::O_RDWR) {
        Ok(f) => {
            let mode = if !hidden("memory.peak.reset") && write_once(&f, b"reset\n", fake).is_ok() {
                PeakMemory::PerRun
            } else {
                PeakMemory::LifetimeOnly
            };
            (Some(f), mode)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => (None, PeakMemory::Unavailable),
        Err(_) => match open_at(dir, c"memory.peak", libc::O_RDONLY) {
            Ok(f) => (Some(f), PeakMemory::LifetimeOnly),
            Err(_) => (None, PeakMemory::Unavailable),
        },
    }
}

/// Per-run peak from the counters, see [`PeakMemory`]. `before` is the lifetime peak read at
/// `prepare_run` (only meaningful for `LifetimeOnly`), `after` the counter now, `sampled` the
/// largest sampled usage (0 = none). Returns the peak and whether it is exact.
fn peak_for_run(
    mode: PeakMemory,
    before: u64,
    after: Option<u64>,
    sampled: u64,
) -> (Option<u64>, bool) {
    let sampled = (sampled > 0).then_some(sampled);
    match (mode, after) {
        (PeakMemory::PerRun, Some(a)) => (Some(a), true),
        (PeakMemory::LifetimeOnly, Some(a)) if a > before => (Some(a), true),
        _ => (sampled, false),
    }
}

/// v1 with memsw: must `memory.memsw.limit_in_bytes` be written before
/// `memory.limit_in_bytes` when going from limit `current` to `new` (unlimited = `u64::MAX`)?
/// memsw must stay >= the memory limit, so raise memsw first and lower memory first.
fn memsw_first(current: u64, new: u64) -> bool {
    new > current
}

// ---------------------------------------------------------------------------------------------
// Slot.

#[derive(Debug, Default, Clone, Copy)]
struct Baseline {
    cpu_ns: u64,
    oom: u64,
    pids_max: u64,
    peak: u64,
}

/// The cgroup(s) of one concurrency slot, reused across runs. Dropping it kills any process
/// left in it (best effort) and removes its directories.
#[derive(Debug)]
pub struct Slot {
    version: Version,
    fake: bool,
    index: usize,
    /// Slot directory per hierarchy (v2: one).
    dirs: Vec<PathBuf>,
    /// `O_DIRECTORY` fds of `dirs`.
    fds: Vec<OwnedFd>,
    /// Hierarchy index per controller `[memory, pids, cpuacct]`.
    ctl: [usize; 3],
    /// `cpuacct.usage` (v1) or `cpu.stat` (v2), read on every CPU poll.
    cpu_file: File,
    /// v2 `memory.peak` (kept open because its reset is local to the fd) or v1
    /// `memory.max_usage_in_bytes` (read-write).
    peak_file: Option<File>,
    peak_mode: PeakMemory,
    has_memsw: bool,
    /// File and key of the OOM-kill counter, and that file kept open.
    oom_source: OomSource,
    oom_file: File,
    /// `pids.events`, when the kernel has it.
    pids_events_file: Option<File>,
    has_kill: bool,
    /// Last limits written (`None` = unknown, e.g. after a failed write).
    mem_limit: Option<Option<u64>>,
    pids_limit: Option<Option<u64>>,
    baseline: Baseline,
    sampled_peak: AtomicU64,
    _base: Arc<BaseDirs>,
}

impl Slot {
    fn path(&self, c: usize, name: &CStr) -> PathBuf {
        self.dirs[self.ctl[c]].join(&*name.to_string_lossy())
    }

    fn open(&self, c: usize, name: &CStr, flags: libc::c_int) -> Result<File, CgroupError> {
        open_at(self.fds[self.ctl[c]].as_fd(), name, flags).map_err(|e| {
            CgroupError::io(format!("cannot open {}", self.path(c, name).display()), e)
        })
    }

    fn write_raw(&self, c: usize, name: &CStr, value: &[u8]) -> io::Result<()> {
        let f = open_at(
            self.fds[self.ctl[c]].as_fd(),
            name,
            libc::O_WRONLY | if self.fake { libc::O_TRUNC } else { 0 },
        )?;
        write_once(&f, value, self.fake)
    }

    fn write(&self, c: usize, name: &CStr, value: &str) -> Result<(), CgroupError> {
        self.write_raw(c, name, value.as_bytes())
            .map_err(|e| self.write_error(c, name, value, e))
    }

    fn write_error(&self, c: usize, name: &CStr, value: &str, e: io::Error) -> CgroupError {
        let hint = if errno(&e) == libc::EBUSY && self.version == Version::V1 && c == MEM {
            " (usage is above the new limit and could not be reclaimed, e.g. tmpfs files left \
             by an earlier run)"
        } else {
            ""
        };
        CgroupError::io(
            format!(
                "cannot write '{}' to {}{hint}",
                value.trim(),
                self.path(c, name).display()
            ),
            e,
        )
    }

    fn read_u64(&self, c: usize, name: &CStr, key: Option<&str>) -> Result<u64, CgroupError> {
        let f = self.open(c, name, libc::O_RDONLY)?;
        let mut buf = [0u8; 1024];
        self.parse_file(c, name, &f, &mut buf, key)
    }

    fn parse_file(
        &self,
        c: usize,
        name: &CStr,
        f: &File,
        buf: &mut [u8],
        key: Option<&str>,
    ) -> Result<u64, CgroupError> {
        let data = read_into(f, buf).map_err(|e| {
            CgroupError::io(format!("cannot read {}", self.path(c, name).display()), e)
        })?;
        let v = match key {
            Some(k) => keyed_u64(data, k),
            None => parse_u64(data),
        };
        v.ok_or_else(|| {
            CgroupError::msg(format!(
                "cannot parse {}{} in {:?}",
                self.path(c, name).display(),
                key.map(|k| format!(" (no '{k}' line)")).unwrap_or_default(),
                String::from_utf8_lossy(data)
            ))
        })
    }

    /// The slot's index as given to [`Manager::create_slot`].
    pub fn index(&self) -> usize {
        self.index
    }

    /// The slot's cgroup directories (v2: one; v1: one per distinct hierarchy).
    pub fn paths(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// How the per-run peak memory is obtained on this kernel.
    pub fn peak_memory_mode(&self) -> PeakMemory {
        self.peak_mode
    }

    /// Sets the memory limit (bytes; `None` = unlimited) and the pids limit (`None` =
    /// unlimited). Writes only what changed since the last successful call. Swap is not
    /// available to the slot: v1 sets `memory.memsw.limit_in_bytes` (when swap accounting is
    /// on) to the same value, v2 set `memory.swap.max` to 0 at creation.
    ///
    /// On v1, lowering the memory limit below the slot's current usage (e.g. tmpfs files left
    /// by an earlier run) fails with `EBUSY`; on v2 the kernel reclaims or OOM-kills instead.
    pub fn set_limits(
        &mut self,
        memory_bytes: Option<u64>,
        max_pids: Option<u64>,
    ) -> Result<(), CgroupError> {
        if self.mem_limit != Some(memory_bytes) {
            self.mem_limit = None;
            match self.version {
                Version::V2 => {
                    self.write(MEM, c"memory.max", &limit_string(memory_bytes, "max"))?
                }
                Version::V1 => self.set_v1_memory(memory_bytes)?,
            }
            self.mem_limit = Some(memory_bytes);
        }
        if self.pids_limit != Some(max_pids) {
            self.pids_limit = None;
            self.write(PIDS, c"pids.max", &limit_string(max_pids, "max"))?;
            self.pids_limit = Some(max_pids);
        }
        Ok(())
    }

    fn set_v1_memory(&self, memory_bytes: Option<u64>) -> Result<(), CgroupError> {
        const MEMORY: &CStr = c"memory.limit_in_bytes";
        const MEMSW: &CStr = c"memory.memsw.limit_in_bytes";
        let value = limit_string(memory_bytes, "-1");
        if !self.has_memsw {
            return self.write(MEM, MEMORY, &value);
        }
        let current = match self.mem_limit {
            Some(cur) => cur.unwrap_or(u64::MAX),
            None => self.read_u64(MEM, MEMORY, None)?,
        };
        let order = if memsw_first(current, memory_bytes.unwrap_or(u64::MAX)) {
            [MEMSW, MEMORY]
        } else {
            [MEMORY, MEMSW]
        };
        let write_pair = |order: [&CStr; 2]| -> Result<(), CgroupError> {
            for name in order {
                self.write_raw(MEM, name, value.as_bytes())
                    .map_err(|e| self.write_error(MEM, name, &value, e))?;
            }
            Ok(())
        };
        match write_pair(order) {
            // Our idea of the current limit was wrong (EINVAL = memsw < memory): other order.
            Err(e) if e.source.as_ref().is_some_and(|s| errno(s) == libc::EINVAL) => {
                write_pair([order[1], order[0]])
            }
            r => r,
        }
    }

    /// Prepares the slot for the next run: resets the peak-memory watermark (see
    /// [`PeakMemory`]) and records the baselines of the CPU time, OOM-kill and pids-limit
    /// counters, so that [`Slot::cpu_time_ns`] and [`Slot::usage`] are per run.
    pub fn prepare_run(&mut self) -> Result<(), CgroupError> {
        let mut peak = 0;
        match self.version {
            Version::V1 => {
                if let Some(f) = &self.peak_file {
                    write_once(f, b"0", self.fake)
                        .map_err(|e| self.write_error(MEM, c"memory.max_usage_in_bytes", "0", e))?
                }
            }
            Version::V2 => match (&self.peak_file, self.peak_mode) {
                // A fake file gets the value the kernel would then report.
                (Some(f), PeakMemory::PerRun) => {
                    write_once(f, if self.fake { b"0\n" } else { b"reset\n" }, self.fake)
                        .map_err(|e| self.write_error(MEM, c"memory.peak", "reset", e))?
                }
                (Some(f), PeakMemory::LifetimeOnly) => {
                    peak = self.parse_file(MEM, c"memory.peak", f, &mut [0u8; 64], None)?
                }
                _ => {}
            },
        }
        self.baseline = Baseline {
            cpu_ns: self.cpu_raw()?,
            oom: self.oom_counter()?,
            pids_max: self.pids_max_counter()?,
            peak,
        };
        self.sampled_peak.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Moves process `pid` into this slot (`cgroup.procs` of each hierarchy). On v1, memory
    /// the process charged before the move stays with its old cgroup, so attach it before it
    /// allocates (e.g. while it waits on a pipe). On v2 prefer `clone3(CLONE_INTO_CGROUP)` with
    /// [`Slot::dir_fd`].
    pub fn attach(&self, pid: libc::pid_t) -> Result<(), CgroupError> {
        // `0` would mean "the writer itself" to the kernel.
        let Some(pid_u64) = u64::try_from(pid).ok().filter(|&p| p > 0) else {
            return Err(CgroupError::msg(format!("cannot attach invalid pid {pid}")));
        };
        let mut buf = [0u8; 20];
        let text = fmt_u64(pid_u64, &mut buf);
        for (h, fd) in self.fds.iter().enumerate() {
            open_at(fd.as_fd(), c"cgroup.procs", libc::O_WRONLY)
                .and_then(|f| write_once(&f, text, self.fake))
                .map_err(|e| {
                    CgroupError::io(
                        format!(
                            "cannot move pid {pid} into {}",
                            self.dirs[h].join("cgroup.procs").display()
                        ),
                        e,
                    )
                })?;
        }
        Ok(())
    }

    /// v2 only: an `O_DIRECTORY` fd of the slot cgroup, for `clone3(CLONE_INTO_CGROUP)`.
    /// `None` on v1.
    pub fn dir_fd(&self) -> Option<BorrowedFd<'_>> {
        match self.version {
            Version::V2 => Some(self.fds[0].as_fd()),
            Version::V1 => None,
        }
    }

    fn cpu_raw(&self) -> Result<u64, CgroupError> {
        let mut buf = [0u8; 2048];
        Ok(match self.version {
            Version::V2 => self
                .parse_file(
                    CPU,
                    c"cpu.stat",
                    &self.cpu_file,
                    &mut buf,
                    Some("usage_usec"),
                )?
                .saturating_mul(1000),
            Version::V1 => {
                self.parse_file(CPU, c"cpuacct.usage", &self.cpu_file, &mut buf, None)?
            }
        })
    }

    /// Total CPU time (ns) used by the slot since [`Slot::prepare_run`]: one `pread` of a file
    /// kept open.
    pub fn cpu_time_ns(&self) -> Result<u64, CgroupError> {
        Ok(self.cpu_raw()?.saturating_sub(self.baseline.cpu_ns))
    }

    fn oom_counter(&self) -> Result<u64, CgroupError> {
        let (name, key) = self.oom_source;
        self.parse_file(MEM, name, &self.oom_file, &mut [0u8; 1024], key)
    }

    fn pids_max_counter(&self) -> Result<u64, CgroupError> {
        match &self.pids_events_file {
            Some(f) => self.parse_file(PIDS, c"pids.events", f, &mut [0u8; 256], Some("max")),
            None => Ok(0),
        }
    }

    /// Reads the slot's current memory usage and remembers the largest value seen since
    /// [`Slot::prepare_run`]. Only useful where [`Slot::peak_memory_mode`] is not `PerRun`:
    /// call it alongside the CPU polls to get an approximate peak.
    pub fn sample_memory(&self) -> Result<u64, CgroupError> {
        let v = match self.version {
            Version::V2 => self.read_u64(MEM, c"memory.current", None)?,
            Version::V1 => self.read_u64(MEM, c"memory.usage_in_bytes", None)?,
        };
        self.sampled_peak.fetch_max(v, Ordering::Relaxed);
        Ok(v)
    }

    /// Per-run figures since [`Slot::prepare_run`] (see the module docs for exactness).
    pub fn usage(&self) -> Result<Usage, CgroupError> {
        let sampled = self.sampled_peak.load(Ordering::Relaxed);
        let (peak_memory_bytes, peak_memory_exact) = match self.version {
            Version::V1 => match &self.peak_file {
                Some(f) => (
                    Some(self.parse_file(
                        MEM,
                        c"memory.max_usage_in_bytes",
                        f,
                        &mut [0u8; 64],
                        None,
                    )?),
                    true,
                ),
                None => (None, false),
            },
            Version::V2 => {
                let after = match &self.peak_file {
                    Some(f) => {
                        Some(self.parse_file(MEM, c"memory.peak", f, &mut [0u8; 64], None)?)
                    }
                    None => None,
                };
                peak_for_run(self.peak_mode, self.baseline.peak, after, sampled)
            }
        };
        Ok(Usage {
            cpu_time_ns: self.cpu_time_ns()?,
            peak_memory_bytes,
            peak_memory_exact,
            oom_killed: self.oom_counter()? > self.baseline.oom,
            pids_limit_hit: self.pids_max_counter()? > self.baseline.pids_max,
        })
    }

    /// Processes in hierarchy `h`, without this process, and whether this process was listed
    /// (one of its threads is in the cgroup, e.g. a v1 supervisor thread joined to the slot).
    fn list_procs(&self, h: usize) -> Result<(Vec<libc::pid_t>, bool), CgroupError> {
        let path = || self.dirs[h].join("cgroup.procs");
        let f = open_at(self.fds[h].as_fd(), c"cgroup.procs", libc::O_RDONLY)
            .map_err(|e| CgroupError::io(format!("cannot open {}", path().display()), e))?;
        let data = read_vec(&f)
            .map_err(|e| CgroupError::io(format!("cannot read {}", path().display()), e))?;
        let mut pids = parse_pids(&data);
        let me = std::process::id() as libc::pid_t;
        let len = pids.len();
        pids.retain(|&p| p != me);
        let has_self = pids.len() != len;
        Ok((pids, has_self))
    }

    /// Kills every process in the slot and waits (bounded, 2 s) until they have left it.
    /// v2 with `cgroup.kill` (5.14+): one race-free write. Otherwise `cgroup.procs` (of every
    /// v1 hierarchy) is read and each process SIGKILLed, repeated until empty; set a pids limit
    /// so that a fork bomb cannot outrun this. When the slot is empty this costs one read of
    /// `cgroup.procs`. Returns how many distinct processes were seen
    /// (on v2 with `cgroup.kill`: those present just before the kill). Errors if processes
    /// remain after the wait.
    ///
    /// This process itself is never killed nor counted, here and in
    /// [`Slot::process_count`]: on v1 a supervisor thread may be joined to the slot (through
    /// `tasks`), which makes our pid appear in `cgroup.procs`; `cgroup.kill` is not used then.
    pub fn kill_all(&self) -> Result<usize, CgroupError> {
        let primary = self.ctl[PIDS];
        let (mut seen, has_self) = self.list_procs(primary)?;
        // cgroup.kill would kill this process too.
        let use_kill = self.has_kill && !has_self;
        if seen.is_empty() {
            // Nothing can fork into an empty cgroup. (v1: `attach` moves a process into every
            // hierarchy and its children inherit that, so the others are empty too.)
            return Ok(0);
        }
        if use_kill {
            self.write_raw(PIDS, c"cgroup.kill", b"1")
                .map_err(|e| self.write_error(PIDS, c"cgroup.kill", "1", e))?;
        }
        let deadline = Instant::now() + KILL_TIMEOUT;
        let mut pause = retry::FIRST_PAUSE;
        let mut current = seen.clone();
        loop {
            if !use_kill {
                for h in (0..self.fds.len()).filter(|&h| h != primary) {
                    current.extend(self.list_procs(h)?.0);
                }
                current.sort_unstable();
                current.dedup();
                seen.extend_from_slice(&current);
                if !self.fake {
                    current.iter().copied().for_each(sigkill);
                }
            }
            if self.fake {
                // Fake pids are not real processes: never signal them, simulate their exit.
                for h in 0..self.fds.len() {
                    let f = open_at(self.fds[h].as_fd(), c"cgroup.procs", libc::O_WRONLY);
                    let _ = f.and_then(|f| write_once(&f, b"", true));
                }
            }
            if current.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(CgroupError::msg(format!(
                    "{} process(es) still in {} {:?} after SIGKILL and a {:?} wait",
                    current.len(),
                    self.dirs[primary].display(),
                    current,
                    KILL_TIMEOUT
                )));
            }
            retry::backoff(&mut pause);
            current = self.list_procs(primary)?.0;
        }
        seen.sort_unstable();
        seen.dedup();
        Ok(seen.len())
    }

    /// Number of processes currently in the slot (v1: in its `pids` hierarchy), not counting
    /// this process.
    pub fn process_count(&self) -> Result<usize, CgroupError> {
        Ok(self.list_procs(self.ctl[PIDS])?.0.len())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.kill_all();
        for d in &self.dirs {
            let _ = remove_cgroup_dir(d, self.fake);
        }
    }
}

// Slots move between threads (and the manager is shared); keep it that way.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Slot>();
    assert_send_sync::<Manager>();
};

// ---------------------------------------------------------------------------------------------
// Tests.

#[cfg(test)]
mod tests {
    use super::*;

    // ----- pure helpers -----

    #[test]
    fn parses_proc_self_cgroup() {
        let text =
            "12:pids:/user.slice\n4:cpu,cpuacct:/a/b\n3:memory:/m\n1:name=systemd:/s\n0::/u/v\n";
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

    // ----- fake trees -----

    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "agentrl-cgroup-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn put(path: &Path, content: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn get(path: &Path) -> String {
        fs::read_to_string(path).unwrap()
    }

    /// A fake v2 cgroup directory (as the kernel would show it) at `dir`.
    fn fake_v2_dir(dir: &Path, controllers: &str, subtree: &str, procs: &str) {
        put(&dir.join("cgroup.controllers"), controllers);
        put(&dir.join("cgroup.subtree_control"), subtree);
        put(&dir.join("cgroup.procs"), procs);
    }

    const ALL: &str = "cpuset cpu io memory hugetlb pids rdma misc\n";
    /// Above the largest possible pid_max (2^22), so never a real process.
    const FAKE_PID: libc::pid_t = 2_147_483_632;
    const NO_MI: &dyn Fn() -> String = &String::new;

    fn fake_v2_root() -> TempDir {
        let t = TempDir::new();
        fake_v2_dir(&t.0, ALL, "", "2147483632\n");
        t
    }

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

    fn fake_v1_root(with_pids: bool) -> TempDir {
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

    // ----- the real cgroup file system (root only) -----

    fn real_manager() -> Option<Manager> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0
            || std::env::var_os("AGENTRL_SKIP_CGROUP_TESTS").is_some()
        {
            eprintln!("skipping: real cgroup tests need root");
            return None;
        }
        Some(Manager::new(None).expect("cgroup manager on this host"))
    }

    /// Forks a child that waits until it has been attached to `slot`, then runs `body` and
    /// exits with its result. `body` runs in a fork of a multi-threaded process, so it may only
    /// use async-signal-safe calls (no allocation).
    fn spawn_in(slot: &Slot, body: fn() -> i32) -> libc::pid_t {
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
        let attached = slot.attach(pid);
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
}
