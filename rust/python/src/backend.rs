//! What the nsjail backend (`agentrl.backends.nsjail`) reuses of the core: the verdict's
//! classification ([`classify_verdict`]), so that both backends judge a run by one rule, and
//! the cgroup code in its nsjail mode ([`NsjailCgroups`], [`NsjailRunCgroup`]: detection,
//! placement, each run's limits, counters, kill and removal; see `docs/design/cgroups.md`).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use agentrl_sandbox as sb;
use agentrl_sandbox::cgroup::{self, CgroupError, JailRun, Manager, Version};
use agentrl_sandbox::verdict::{self, Kill};

use crate::errors::{invalid, to_py};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(classify_verdict, m)?)?;
    m.add_class::<NsjailCgroups>()?;
    m.add_class::<NsjailRunCgroup>()?;
    Ok(())
}

fn cgroup_err(e: CgroupError) -> PyErr {
    to_py(sb::Error::Setup {
        what: e.what,
        source: e.source,
    })
}

fn version_name(v: Version) -> &'static str {
    match v {
        Version::V1 => "v1",
        Version::V2 => "v2",
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Takes what `slot` holds, unless this is a forked copy of the process that made it: a
/// child must leave its parent's cgroups alone, so its copy is forgotten, never removed.
fn take_owned<T>(slot: &Mutex<Option<T>>, owner: u32) -> Option<T> {
    let taken = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if std::process::id() != owner {
        std::mem::forget(taken);
        return None;
    }
    taken
}

/// The nsjail backend's cgroups: the base `agentrl-nsjail-<pid>-<n>` (v1: in the `memory`,
/// `pids` and `cpuacct` hierarchies; v2: one cgroup), placed as the native backend places
/// its own, and the runs below it. ``parent`` is a cgroup path relative to each hierarchy's
/// mount (v2: to the root), or None for this process's own cgroup.
#[pyclass(frozen, name = "NsjailCgroups", module = "agentrl._core")]
struct NsjailCgroups {
    inner: Mutex<Option<Manager>>,
    version: Version,
    next_run: AtomicUsize,
    owner: u32,
}

#[pymethods]
impl NsjailCgroups {
    #[new]
    #[pyo3(signature = (parent=None))]
    fn new(py: Python<'_>, parent: Option<&str>) -> PyResult<Self> {
        if parent.is_some_and(|p| Path::new(p).is_absolute()) {
            return Err(invalid("parent", "must be relative to the cgroup mount"));
        }
        let m = py
            .detach(|| Manager::for_nsjail(parent.map(Path::new)))
            .map_err(cgroup_err)?;
        Ok(NsjailCgroups {
            version: m.version(),
            inner: Mutex::new(Some(m)),
            next_run: AtomicUsize::new(0),
            owner: std::process::id(),
        })
    }

    /// ``"v1"`` or ``"v2"``: which hierarchy the host offers, or None where neither is
    /// usable (no cgroup is made).
    #[staticmethod]
    fn detect() -> Option<&'static str> {
        cgroup::detect_version(Path::new(cgroup::DEFAULT_ROOT)).map(version_name)
    }

    /// ``"v1"`` or ``"v2"``.
    #[getter]
    fn version(&self) -> &'static str {
        version_name(self.version)
    }

    /// Where the hierarchy of ``controller`` is mounted (v2: the root), as nsjail's v1 flags
    /// name it.
    fn mount(&self, controller: &str) -> PyResult<String> {
        self.with(|m| {
            m.mount_of(controller)
                .map(path_str)
                .map_err(|e| invalid("controller", e.what))
        })
    }

    /// Creates the next run's cgroup(s) (``run-<n>``), without limits yet.
    fn new_run(&self, py: Python<'_>) -> PyResult<NsjailRunCgroup> {
        let n = self.next_run.fetch_add(1, Ordering::Relaxed);
        let run = py.detach(|| self.with(|m| m.create_jail_run(n).map_err(cgroup_err)))?;
        Ok(NsjailRunCgroup {
            version: run.version(),
            inner: Mutex::new(Some(run)),
            owner: self.owner,
        })
    }

    /// Lets go of the base: it is removed once every run is removed too. Idempotent.
    fn remove(&self, py: Python<'_>) {
        let m = take_owned(&self.inner, self.owner);
        py.detach(move || drop(m));
    }
}

impl NsjailCgroups {
    fn with<T>(&self, f: impl FnOnce(&Manager) -> PyResult<T>) -> PyResult<T> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(m) => f(m),
            None => Err(to_py(sb::Error::Closed)),
        }
    }
}

impl Drop for NsjailCgroups {
    fn drop(&mut self) {
        drop(take_owned(&self.inner, self.owner));
    }
}

/// The cgroup(s) of one nsjail run: its exact limits, counters, kill switch and removal.
#[pyclass(frozen, name = "NsjailRunCgroup", module = "agentrl._core")]
struct NsjailRunCgroup {
    inner: Mutex<Option<JailRun>>,
    version: Version,
    owner: u32,
}

#[pymethods]
impl NsjailRunCgroup {
    /// ``"v1"`` or ``"v2"``.
    #[getter]
    fn version(&self) -> &'static str {
        version_name(self.version)
    }

    /// The run's directory in the hierarchy of ``controller`` (``memory``, ``pids``,
    /// ``cpuacct``; v2: the one directory).
    fn dir(&self, controller: &str) -> PyResult<String> {
        self.with(|r| {
            r.dir(controller)
                .map(path_str)
                .map_err(|e| invalid("controller", e.what))
        })
    }

    /// Writes the exact limits (v1: no memsw, swappiness 0, then the OOM eventfd; v2: also
    /// ``+memory +pids`` for nsjail's child cgroup).
    fn set_limits(&self, py: Python<'_>, memory_bytes: u64, max_pids: u64) -> PyResult<()> {
        py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_mut() {
                Some(r) => r.set_limits(memory_bytes, max_pids).map_err(cgroup_err),
                None => Err(to_py(sb::Error::Closed)),
            }
        })
    }

    /// CPU time (ns) of every process of the run; None if it cannot be read.
    fn cpu_ns(&self) -> Option<u64> {
        self.with(|r| Ok(r.cpu_ns().ok())).ok().flatten()
    }

    /// The counters the verdict reads: ``peak``, ``failcnt``, ``oom_kill``, ``pids_peak``,
    /// ``pids_max_events`` (None where the host lacks them).
    fn usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = self.with(|r| Ok(r.usage()))?;
        let d = PyDict::new(py);
        d.set_item("peak", u.peak)?;
        d.set_item("failcnt", u.failcnt)?;
        d.set_item("oom_kill", u.oom_kill)?;
        d.set_item("pids_peak", u.pids_peak)?;
        d.set_item("pids_max_events", u.pids_max_events)?;
        Ok(d)
    }

    /// SIGKILLs every process of the run but ``exclude_pid`` (nsjail) until none is left
    /// (at most 2 s); returns how many were signalled. A removed run has none.
    fn kill(&self, py: Python<'_>, exclude_pid: i32) -> usize {
        py.detach(|| self.with(|r| Ok(r.kill_except(exclude_pid))).unwrap_or(0))
    }

    /// Removes the run's cgroups and nsjail's left below them. Idempotent.
    fn remove(&self, py: Python<'_>) -> PyResult<()> {
        let r = take_owned(&self.inner, self.owner);
        py.detach(move || r.map_or(Ok(()), JailRun::remove))
            .map_err(cgroup_err)
    }
}

impl NsjailRunCgroup {
    fn with<T>(&self, f: impl FnOnce(&JailRun) -> PyResult<T>) -> PyResult<T> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(r) => f(r),
            None => Err(to_py(sb::Error::Closed)),
        }
    }
}

impl Drop for NsjailRunCgroup {
    fn drop(&mut self) {
        drop(take_owned(&self.inner, self.owner));
    }
}

/// The status and the limit that decided it (or another limit the run hit), as the native
/// backend classifies its runs: ``(status, limit or None)`` by their Python names.
/// ``killed`` is why the supervisor killed the run: ``"wall_time"``, ``"cpu_time"``,
/// ``"output"`` or None.
#[pyfunction]
#[pyo3(signature = (oom, killed, signal, exit_code, cpu_exhausted, truncated, pids_hit))]
fn classify_verdict(
    oom: bool,
    killed: Option<&str>,
    signal: Option<i32>,
    exit_code: Option<i32>,
    cpu_exhausted: bool,
    truncated: bool,
    pids_hit: bool,
) -> PyResult<(&'static str, Option<&'static str>)> {
    let killed = match killed {
        None => None,
        Some("wall_time") => Some(Kill::WallTime),
        Some("cpu_time") => Some(Kill::CpuTime),
        Some("output") => Some(Kill::Output),
        Some(other) => {
            return Err(crate::errors::invalid(
                "killed",
                format!("must be 'wall_time', 'cpu_time', 'output' or None, got {other:?}"),
            ))
        }
    };
    let (status, limit) = verdict::classify(
        oom,
        killed,
        signal,
        exit_code,
        cpu_exhausted,
        truncated,
        pids_hit,
    );
    Ok((status.as_str(), limit.map(|l| l.as_str())))
}
