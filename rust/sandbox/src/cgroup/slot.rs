//! A [`Slot`]: the cgroup(s) of one concurrency slot, its limits, the per-run reset
//! ([`Slot::prepare_run`]) and figures ([`Slot::usage`]), attaching and killing processes.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::detect::hidden;
use super::dirs::{remove_cgroup_dir, BaseDirs};
use super::files::{
    errno, fmt_u64, keyed_u64, limit_string, open_at, parse_pids, parse_u64, read_into, read_vec,
    sigkill, write_once,
};
use super::{CgroupError, PeakMemory, Usage, Version, CPU, KILL_TIMEOUT, MEM, PIDS};
use crate::retry;

/// Which file holds the OOM-kill counter, and the key of its line (`None`: the whole file).
pub(super) type OomSource = (&'static CStr, Option<&'static str>);
pub(super) const OOM_V2: OomSource = (c"memory.events", Some("oom_kill"));
pub(super) const OOM_V1: OomSource = (c"memory.oom_control", Some("oom_kill"));
/// Kernels before 4.13 have no `oom_kill` line: count limit hits instead.
pub(super) const OOM_V1_FAILCNT: OomSource = (c"memory.failcnt", None);

/// Opens v2 `memory.peak` read-write and checks whether a write resets it (Linux 6.12+).
pub(super) fn probe_v2_peak(dir: BorrowedFd<'_>, fake: bool) -> (Option<File>, PeakMemory) {
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
pub(super) fn peak_for_run(
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
pub(super) fn memsw_first(current: u64, new: u64) -> bool {
    new > current
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Baseline {
    cpu_ns: u64,
    oom: u64,
    pids_max: u64,
    peak: u64,
}

/// The cgroup(s) of one concurrency slot, reused across runs. Dropping it kills any process
/// left in it (best effort) and removes its directories.
#[derive(Debug)]
pub struct Slot {
    pub(super) version: Version,
    pub(super) fake: bool,
    pub(super) index: usize,
    /// Slot directory per hierarchy (v2: one).
    pub(super) dirs: Vec<PathBuf>,
    /// `O_DIRECTORY` fds of `dirs`.
    pub(super) fds: Vec<OwnedFd>,
    /// Hierarchy index per controller `[memory, pids, cpuacct]`.
    pub(super) ctl: [usize; 3],
    /// `cpuacct.usage` (v1) or `cpu.stat` (v2), read on every CPU poll.
    pub(super) cpu_file: File,
    /// v2 `memory.peak` (kept open because its reset is local to the fd) or v1
    /// `memory.max_usage_in_bytes` (read-write).
    pub(super) peak_file: Option<File>,
    pub(super) peak_mode: PeakMemory,
    pub(super) has_memsw: bool,
    /// File and key of the OOM-kill counter, and that file kept open.
    pub(super) oom_source: OomSource,
    pub(super) oom_file: File,
    /// `pids.events`, when the kernel has it.
    pub(super) pids_events_file: Option<File>,
    pub(super) has_kill: bool,
    /// Last limits written (`None` = unknown, e.g. after a failed write).
    pub(super) mem_limit: Option<Option<u64>>,
    pub(super) pids_limit: Option<Option<u64>>,
    pub(super) baseline: Baseline,
    pub(super) sampled_peak: AtomicU64,
    pub(super) _base: Arc<BaseDirs>,
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

    pub(super) fn write_raw(&self, c: usize, name: &CStr, value: &[u8]) -> io::Result<()> {
        let f = open_at(
            self.fds[self.ctl[c]].as_fd(),
            name,
            libc::O_WRONLY | if self.fake { libc::O_TRUNC } else { 0 },
        )?;
        write_once(&f, value, self.fake)
    }

    pub(super) fn write(&self, c: usize, name: &CStr, value: &str) -> Result<(), CgroupError> {
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

    pub(super) fn read_u64(
        &self,
        c: usize,
        name: &CStr,
        key: Option<&str>,
    ) -> Result<u64, CgroupError> {
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

    /// The slot's index as given to [`Manager::create_slot`](super::Manager::create_slot).
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

    pub(super) fn cpu_raw(&self) -> Result<u64, CgroupError> {
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

    /// Per-run figures since [`Slot::prepare_run`] (see `docs/design/cgroups.md` for exactness).
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
    pub(super) fn list_procs(&self, h: usize) -> Result<(Vec<libc::pid_t>, bool), CgroupError> {
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
