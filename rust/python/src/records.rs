//! The typed records that cross the boundary: limits, run requests and pool jobs come in as
//! Python objects read **by field name** (`#[derive(FromPyObject)]`, so a renamed or missing
//! field is an error that names it, never a value taken from the wrong position); a verdict
//! goes out as a frozen [`Verdict`] (`_core.ExecResult`, the crate's [`sb::ExecResult`] as it
//! is) whose fields are typed attributes.
//!
//! The rules a limit must follow live in one place, [`sb::Limits::validate`]: the Python
//! `Limits` calls [`check_limits`] when it is made, the crate calls it again on its own API
//! (for Rust callers), and both report through the one error map ([`crate::errors`]).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use agentrl_sandbox as sb;

use crate::errors::to_py;

/// `agentrl.Limits`, read by field name.
#[derive(FromPyObject)]
pub(crate) struct LimitsArg {
    wall_time_s: f64,
    cpu_time_s: f64,
    memory_bytes: u64,
    max_pids: u64,
    max_output_bytes: u64,
    max_file_bytes: u64,
    max_open_files: u64,
    tmpfs_bytes: u64,
}

impl From<LimitsArg> for sb::Limits {
    fn from(l: LimitsArg) -> Self {
        sb::Limits {
            wall_time_s: l.wall_time_s,
            cpu_time_s: l.cpu_time_s,
            memory_bytes: l.memory_bytes,
            max_pids: l.max_pids,
            max_output_bytes: l.max_output_bytes,
            max_file_bytes: l.max_file_bytes,
            max_open_files: l.max_open_files,
            tmpfs_bytes: l.tmpfs_bytes,
        }
    }
}

/// Checks an `agentrl.Limits` against the crate's rules; raises `InvalidArgument` (a
/// `ValueError`) whose `field` names the first bad field.
#[pyfunction]
pub(crate) fn check_limits(limits: LimitsArg) -> PyResult<()> {
    sb::Limits::from(limits).validate().map_err(to_py)
}

/// `agentrl.sandbox.args.RunRequest`, read by field name: one run, as the shared argument
/// checks left it (paths and names already in the box's terms).
#[derive(FromPyObject)]
pub(crate) struct RequestArg {
    argv: Vec<Vec<u8>>,
    stdin: Vec<u8>,
    files: Vec<(String, Vec<u8>)>,
    collect: Vec<String>,
    limits: Option<LimitsArg>,
    cwd: Option<String>,
    env: Vec<(String, String)>,
    warm: bool,
    pass_fds: Vec<i32>,
}

impl RequestArg {
    /// The crate's request; the caller's `pass_fds` are duplicated, so the run holds its own
    /// copies whatever the caller closes meanwhile.
    pub(crate) fn into_request(self) -> PyResult<sb::RunRequest> {
        Ok(sb::RunRequest {
            argv: self.argv,
            stdin: self.stdin,
            files: self.files,
            collect: self.collect,
            limits: self.limits.map(sb::Limits::from),
            cwd: self.cwd,
            env: self.env,
            warm: self.warm,
            pass_fds: dup_fds("pass_fds", &self.pass_fds)?,
            ..sb::RunRequest::default()
        })
    }
}

/// `agentrl.pool.jobs.PoolJob`, read by field name: a request and how the scheduler treats it.
#[derive(FromPyObject)]
pub(crate) struct JobArg {
    pub request: RequestArg,
    pub group: u64,
    pub priority: i32,
    pub deadline: Option<f64>,
}

/// The verdict of one run as the crate returns it, `_core.ExecResult`. `agentrl.ExecResult`
/// is made from it (`ExecResult._from_core`), which documents each field.
#[pyclass(frozen, get_all, name = "ExecResult", module = "agentrl._core")]
pub(crate) struct Verdict {
    status: &'static str,
    exit_code: Option<i32>,
    signal: Option<i32>,
    stdout: Py<PyBytes>,
    stderr: Py<PyBytes>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    wall_time_s: f64,
    cpu_time_s: f64,
    peak_memory_bytes: Option<u64>,
    peak_memory_exact: bool,
    limit: Option<&'static str>,
    denied_syscalls: Vec<String>,
    files: Py<PyDict>,
    truncated_files: Vec<String>,
    error: Option<String>,
}

#[pymethods]
impl Verdict {
    fn __repr__(&self) -> String {
        format!(
            "ExecResult(status={:?}, exit_code={:?}, signal={:?}, limit={:?})",
            self.status, self.exit_code, self.signal, self.limit
        )
    }
}

impl Verdict {
    pub(crate) fn new(py: Python<'_>, r: sb::ExecResult) -> PyResult<Self> {
        let files = PyDict::new(py);
        for (k, v) in r.files {
            files.set_item(k, PyBytes::new(py, &v))?;
        }
        Ok(Verdict {
            status: r.status.as_str(),
            exit_code: r.exit_code,
            signal: r.signal,
            stdout: PyBytes::new(py, &r.stdout).unbind(),
            stderr: PyBytes::new(py, &r.stderr).unbind(),
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            wall_time_s: r.wall_time_s,
            cpu_time_s: r.cpu_time_s,
            peak_memory_bytes: r.peak_memory_bytes,
            peak_memory_exact: r.peak_memory_exact,
            limit: r.limit.map(|l| l.as_str()),
            denied_syscalls: r.denied_syscalls,
            files: files.unbind(),
            truncated_files: r.truncated_files,
            error: r.error,
        })
    }

    /// The verdict as a Python object.
    pub(crate) fn into_py(py: Python<'_>, r: sb::ExecResult) -> PyResult<Bound<'_, PyAny>> {
        Ok(Bound::new(py, Verdict::new(py, r)?)?.into_any())
    }
}

/// Our own duplicates of the caller's fds (`field` names the argument in errors).
pub(crate) fn dup_fds(field: &str, fds: &[i32]) -> PyResult<Vec<Arc<std::os::fd::OwnedFd>>> {
    use std::os::fd::FromRawFd;
    fds.iter()
        .map(|&fd| {
            if fd < 0 {
                return Err(crate::errors::invalid(
                    field,
                    format!("{fd} is not a file descriptor"),
                ));
            }
            // SAFETY: F_DUPFD_CLOEXEC on any int is safe: it fails with EBADF unless the fd is
            // open, and a success returns a new fd that we own.
            let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if new < 0 {
                let e = std::io::Error::last_os_error();
                return Err(crate::errors::invalid(field, format!("fd {fd}: {e}")));
            }
            // SAFETY: a fresh fd from fcntl, owned by nobody else.
            Ok(Arc::new(unsafe { std::os::fd::OwnedFd::from_raw_fd(new) }))
        })
        .collect()
}
