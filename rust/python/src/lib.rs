//! `agentrl._core`: the thin PyO3 binding over the Rust crates.
//!
//! Each method converts its arguments, releases the GIL for the real work (`py.detach`) and
//! maps errors through [`to_py`] into one exception tree rooted at `AgentRLError`. The Python
//! package (`python/agentrl`) wraps these handles with validation, docs and asyncio support.

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use agentrl_sandbox as sb;

mod backend;
mod errors;
mod pool;
mod records;

use errors::{to_py, SandboxError};
use records::{dup_fds, LimitsArg, RequestArg, Verdict};

/// Handle of a Rust sandbox.
#[pyclass(frozen, name = "Sandbox", module = "agentrl._core")]
struct PySandbox {
    inner: Arc<sb::Sandbox>,
}

#[pymethods]
impl PySandbox {
    #[new]
    #[pyo3(signature = (limits, network, system_paths, binds, env, max_concurrency, degraded, cgroup_parent=None, warm=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        limits: LimitsArg,
        network: bool,
        system_paths: Vec<PathBuf>,
        binds: Vec<(PathBuf, PathBuf, bool)>,
        env: Vec<(String, String)>,
        max_concurrency: usize,
        degraded: bool,
        cgroup_parent: Option<PathBuf>,
        warm: Option<(Vec<String>, PathBuf, f64)>,
    ) -> PyResult<Self> {
        let config = sb::SandboxConfig {
            limits: limits.into(),
            network,
            system_paths,
            binds: binds
                .into_iter()
                .map(|(source, target, writable)| sb::Bind {
                    source,
                    target,
                    writable,
                })
                .collect(),
            env,
            max_concurrency,
            degraded,
            cgroup_parent,
            warm: warm.map(|(argv, core_module, timeout)| sb::warm::WarmConfig {
                argv,
                core_module,
                start_timeout: std::time::Duration::from_secs_f64(timeout.clamp(1.0, 3600.0)),
            }),
            ..sb::SandboxConfig::default()
        };
        let inner = py.detach(|| sb::Sandbox::new(config)).map_err(to_py)?;
        Ok(PySandbox {
            inner: Arc::new(inner),
        })
    }

    /// Runs one request (an `agentrl.sandbox.args.RunRequest`); returns its `Verdict`.
    #[pyo3(signature = (request, session=None, tee=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        request: RequestArg,
        session: Option<PyRef<'py, PySession>>,
        tee: Option<(i32, i32)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut req = request.into_request()?;
        req.session = session.map(|s| s.inner.clone());
        req.tee = match tee {
            Some((o, e)) => {
                let mut fds = dup_fds("tee", &[o, e])?.into_iter();
                fds.next().zip(fds.next())
            }
            None => None,
        };
        let inner = self.inner.clone();
        // The run blocks this thread without the GIL; a signal (Ctrl-C) is looked for every
        // 100 ms, and one that raises cancels the run and is raised here instead of a verdict.
        let mut raised: Option<PyErr> = None;
        let r = py.detach(|| {
            inner.run_interruptible(req, Duration::from_millis(100), || {
                match Python::attach(|py| py.check_signals()) {
                    Ok(()) => false,
                    Err(e) => {
                        raised = Some(e);
                        true
                    }
                }
            })
        });
        if let Some(e) = raised {
            return Err(e);
        }
        Verdict::into_py(py, r.map_err(to_py)?)
    }

    /// Creates a persistent session.
    fn session(
        &self,
        py: Python<'_>,
        files: Vec<(String, Vec<u8>)>,
        disk_bytes: u64,
    ) -> PyResult<PySession> {
        let inner = self.inner.clone();
        let s = py
            .detach(move || inner.session(files, disk_bytes))
            .map_err(to_py)?;
        Ok(PySession { inner: s })
    }

    /// Stops the slots and removes the cgroups. Idempotent. `cancel`: runs waiting or in
    /// flight are cancelled (their boxes killed) rather than waited for.
    #[pyo3(signature = (cancel=false))]
    fn close(&self, py: Python<'_>, cancel: bool) {
        let inner = self.inner.clone();
        py.detach(move || {
            if cancel {
                inner.close_now()
            } else {
                inner.close()
            }
        });
    }

    /// "v1", "v2", or None in degraded mode.
    #[getter]
    fn cgroup_version(&self) -> Option<&'static str> {
        self.inner.cgroup_version().map(|v| match v {
            sb::cgroup::Version::V1 => "v1",
            sb::cgroup::Version::V2 => "v2",
        })
    }

    /// Slots (concurrent boxes) created so far.
    #[getter]
    fn slots(&self) -> usize {
        self.inner.slots()
    }
}

/// Handle of a session's layers.
#[pyclass(frozen, name = "Session", module = "agentrl._core")]
struct PySession {
    inner: sb::Session,
}

/// A frozen state of a session.
#[pyclass(frozen, name = "Snapshot", module = "agentrl._core")]
struct PySnapshot {
    inner: sb::Snapshot,
}

#[pymethods]
impl PySession {
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.inner.clone();
        py.detach(move || s.reset()).map_err(to_py)
    }

    fn snapshot(&self, py: Python<'_>) -> PyResult<PySnapshot> {
        let s = self.inner.clone();
        let snap = py.detach(move || s.snapshot()).map_err(to_py)?;
        Ok(PySnapshot { inner: snap })
    }

    fn restore(&self, py: Python<'_>, snap: PyRef<'_, PySnapshot>) -> PyResult<()> {
        let (s, snap) = (self.inner.clone(), snap.inner.clone());
        py.detach(move || s.restore(&snap)).map_err(to_py)
    }

    fn close(&self, py: Python<'_>) {
        let s = self.inner.clone();
        py.detach(move || s.close());
    }
}

// ---- Used only inside a warm interpreter (see agentrl-sandbox's `warm` module). ----

fn borrow(fd: i32) -> PyResult<BorrowedFd<'static>> {
    if fd < 0 {
        return Err(PyValueError::new_err(format!("invalid fd {fd}")));
    }
    // SAFETY: the caller (the warm interpreter's bootstrap) passes an fd it keeps open for the
    // duration of the call.
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// Raises SandboxError, in one line that names what is missing, unless this process may build
/// boxes (Linux 5.12+, root with CAP_SYS_ADMIN); every backend calls it first.
#[pyfunction]
fn check_host() -> PyResult<()> {
    sb::preflight::check().map_err(to_py)
}

/// The host ids boxes may use in this process's user namespace, `(first, count)` for the
/// native backend's slots and sessions and for the nsjail backend's runs (see
/// `agentrl_sandbox::ids`: fixed ranges on a root host, parts of the subordinate ids in
/// rootless mode).
#[pyfunction]
fn _host_id_ranges() -> PyResult<((u32, u32), (u32, u32))> {
    sb::ids::IdSpace::for_this_process(sb::config::DEFAULT_HOST_ID_BASE)
        .map(|s| ((s.base, s.session_offset + s.sessions), s.nsjail))
        .map_err(|e| SandboxError::new_err(format!("host ids: {e}")))
}

/// Compiles the seccomp policies before the first fork.
#[pyfunction]
fn _warm_init() {
    sb::warm::interpreter_init();
}

/// Returns the free pages of the heap to the kernel (last, before the interpreter says ready).
#[pyfunction]
fn _warm_trim() {
    sb::warm::release_free_heap();
}

/// The warm interpreter, as the request loop sees it.
struct Warm<'py> {
    py: Python<'py>,
    before_fork: Vec<Bound<'py, PyAny>>,
}

impl sb::warm::Interpreter for Warm<'_> {
    fn before_fork(&mut self) {
        // The bootstrap's callables (flush the output, freeze the heap); a failure only
        // costs what that step was for.
        for f in &self.before_fork {
            if f.call0().is_err() {
                let _ = PyErr::take(self.py);
            }
        }
    }

    fn fork(&mut self) -> std::io::Result<libc::pid_t> {
        // SAFETY: os.fork's sequence, with the GIL held (this is a #[pyfunction]): the
        // interpreter's pre-fork hooks, fork, then its hooks for the side we are on.
        unsafe {
            pyo3::ffi::PyOS_BeforeFork();
            let pid = libc::fork();
            let err = std::io::Error::last_os_error();
            if pid == 0 {
                pyo3::ffi::PyOS_AfterFork_Child();
            } else {
                pyo3::ffi::PyOS_AfterFork_Parent();
            }
            if pid < 0 {
                return Err(err);
            }
            Ok(pid)
        }
    }

    fn blocking<T: Send>(&mut self, f: impl FnOnce() -> T + Send) -> T {
        self.py.detach(f)
    }
}

/// The warm interpreter's request loop (see agentrl-sandbox's `warm::serve`), calling each
/// of `before_fork` before each fork. It returns only in a run, set up, with the environment
/// to install, or None when that is `own_env` (the interpreter's, in order); in the
/// interpreter it raises `EOFError` at end of file. (It imports nothing: a module it imported
/// would be one more for every run to remove.)
#[pyfunction]
fn _warm_serve(
    py: Python<'_>,
    fd: i32,
    before_fork: Vec<Bound<'_, PyAny>>,
    own_env: Bound<'_, PyAny>,
) -> PyResult<Option<Vec<(String, String)>>> {
    let sock = borrow(fd)?;
    // An environment that is not plain text (it cannot be) matches no request: empty.
    let own = match own_env.extract::<Vec<(String, String)>>() {
        Ok(own) => {
            let own: Vec<Vec<u8>> = own
                .iter()
                .map(|(k, v)| format!("{k}={v}").into_bytes())
                .collect();
            sb::warm::encode_env(own.iter().map(|e| e.as_slice()))
        }
        Err(_) => Vec::new(),
    };
    let mut warm = Warm { py, before_fork };
    match sb::warm::serve(sock, &mut warm, &own) {
        Ok(Some(env)) => Ok(env),
        Ok(None) => Err(pyo3::exceptions::PyEOFError::new_err("no more requests")),
        Err(e) => Err(SandboxError::new_err(e.to_string())),
    }
}

/// Sends one message with fds.
#[pyfunction]
fn _warm_send(fd: i32, data: &[u8], fds: Vec<i32>) -> PyResult<()> {
    if fds.len() > 8 {
        return Err(PyValueError::new_err("at most 8 fds per message"));
    }
    sb::fdpass::send(borrow(fd)?, data, &fds).map_err(|e| SandboxError::new_err(e.to_string()))
}

/// The seccomp policy in words (for the nsjail backend): a dict of lists.
#[pyfunction]
fn seccomp_policy(py: Python<'_>, network: bool) -> PyResult<Bound<'_, PyDict>> {
    let p = sb::seccomp::describe(&sb::seccomp::Policy {
        allow_network: network,
    });
    let d = PyDict::new(py);
    d.set_item("allow", p.allow)?;
    d.set_item("deny", p.deny)?;
    d.set_item("enosys", p.enosys)?;
    d.set_item(
        "errno",
        p.errno
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>(),
    )?;
    d.set_item("netlink_protocols", p.netlink_protocols)?;
    d.set_item("plain_netlink_protocols", p.plain_netlink_protocols)?;
    d.set_item("clone_refused_flags", p.clone_refused_flags)?;
    d.set_item("socket_domains", p.socket_domains)?;
    d.set_item("refused_ioctls", p.refused_ioctls)?;
    d.set_item("personalities", p.personalities)?;
    d.set_item("pinned_rlimits", p.pinned_rlimits)?;
    Ok(d)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySandbox>()?;
    m.add_class::<PySession>()?;
    m.add_class::<PySnapshot>()?;
    m.add_class::<Verdict>()?;
    errors::register(m)?;
    pool::register(m)?;
    backend::register(m)?;
    m.add_function(wrap_pyfunction!(records::check_limits, m)?)?;
    m.add_function(wrap_pyfunction!(seccomp_policy, m)?)?;
    m.add_function(wrap_pyfunction!(check_host, m)?)?;
    m.add_function(wrap_pyfunction!(_host_id_ranges, m)?)?;
    m.add_function(wrap_pyfunction!(_warm_init, m)?)?;
    m.add_function(wrap_pyfunction!(_warm_send, m)?)?;
    m.add_function(wrap_pyfunction!(_warm_serve, m)?)?;
    m.add_function(wrap_pyfunction!(_warm_trim, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
