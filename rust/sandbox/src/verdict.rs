//! The verdict record of one run, in the spirit of isolate's meta file.

use std::fmt;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Exited with status 0 within every limit.
    Ok,
    /// Exited with a non-zero status.
    RuntimeError,
    /// Killed by a signal it did not ask for from the sandbox (segfault, abort, SIGSYS...).
    Signaled,
    /// Ran past its wall-clock or CPU-time limit and was killed.
    Timeout,
    /// Killed by the memory limit.
    MemoryLimit,
    /// Wrote more than the output cap to stdout or stderr.
    OutputLimit,
    /// The sandbox itself failed (an infrastructure error, never the program's fault).
    SandboxError,
}

impl Status {
    /// The status as the stable lowercase name used by the Python API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::RuntimeError => "runtime_error",
            Status::Signaled => "signaled",
            Status::Timeout => "timeout",
            Status::MemoryLimit => "memory_limit",
            Status::OutputLimit => "output_limit",
            Status::SandboxError => "sandbox_error",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which limit fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    WallTime,
    CpuTime,
    Memory,
    Output,
    Pids,
    FileSize,
}

impl LimitKind {
    /// Stable lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::WallTime => "wall_time",
            LimitKind::CpuTime => "cpu_time",
            LimitKind::Memory => "memory",
            LimitKind::Output => "output",
            LimitKind::Pids => "pids",
            LimitKind::FileSize => "file_size",
        }
    }
}

/// The record of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecResult {
    pub status: Status,
    /// Exit status when the program exited normally.
    pub exit_code: Option<i32>,
    /// Terminating signal when it was killed by one.
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub wall_time_s: f64,
    pub cpu_time_s: f64,
    pub peak_memory_bytes: Option<u64>,
    /// `true` when `peak_memory_bytes` is the run's exact peak; `false` when it is a lower
    /// bound (cgroup v2 before Linux 6.12 cannot reset the peak counter per run: the largest
    /// sampled usage) or absent.
    pub peak_memory_exact: bool,
    /// The limit that decided the status (for `timeout`, `memory_limit`, `output_limit`), or
    /// another limit the run hit (`pids`, `file_size`).
    pub limit: Option<LimitKind>,
    /// Names of the system calls the seccomp policy denied, in order, without repeats.
    pub denied_syscalls: Vec<String>,
    /// Collected files (relative path, contents), in the order asked for; missing ones absent.
    pub files: Vec<(String, Vec<u8>)>,
    /// Collected files that were cut at the cap.
    pub truncated_files: Vec<String>,
    /// For `sandbox_error`: what failed.
    pub error: Option<String>,
}

impl ExecResult {
    /// A `sandbox_error` verdict with the given reason.
    pub fn sandbox_error(reason: impl Into<String>) -> Self {
        ExecResult {
            status: Status::SandboxError,
            exit_code: None,
            signal: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            wall_time_s: 0.0,
            cpu_time_s: 0.0,
            peak_memory_bytes: None,
            peak_memory_exact: false,
            limit: None,
            denied_syscalls: Vec::new(),
            files: Vec::new(),
            truncated_files: Vec::new(),
            error: Some(reason.into()),
        }
    }

    /// True when the status is `ok`.
    pub fn ok(&self) -> bool {
        self.status == Status::Ok
    }
}
