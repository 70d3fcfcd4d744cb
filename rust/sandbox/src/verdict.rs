//! The verdict record of one run, in the spirit of isolate's meta file, and how a run's
//! outcome becomes its status ([`classify`], shared by both backends: the native supervisor and,
//! through `agentrl._core.classify_verdict`, the nsjail backend).

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

/// Why the supervisor killed the box, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    WallTime,
    CpuTime,
    /// The run was cancelled (`RunRequest::cancel`).
    Cancelled,
    /// A stream went far past its cap (an endless flood): see `supervise::Capture::flooded`.
    Output,
}

/// The status of a finished run and the limit that decided it, in order of precedence: the
/// memory limit (`oom`: the OOM killer killed a process of the run), a kill for output, for
/// the wall clock, the CPU time (a kill for it, `SIGXCPU`, or a `SIGKILL` once the CPU budget
/// was spent), output past its cap (`truncated`), a signal (`SIGXFSZ`: the file size limit),
/// the exit code. `pids_hit` (the run reached its pids limit) is noted as the limit of a run
/// that no other limit decided.
pub fn classify(
    oom: bool,
    killed: Option<Kill>,
    signal: Option<i32>,
    exit_code: Option<i32>,
    cpu_exhausted: bool,
    truncated: bool,
    pids_hit: bool,
) -> (Status, Option<LimitKind>) {
    let pids = if pids_hit {
        Some(LimitKind::Pids)
    } else {
        None
    };
    if oom {
        (Status::MemoryLimit, Some(LimitKind::Memory))
    } else if killed == Some(Kill::Output) {
        (Status::OutputLimit, Some(LimitKind::Output))
    } else if killed == Some(Kill::WallTime) {
        (Status::Timeout, Some(LimitKind::WallTime))
    } else if killed == Some(Kill::CpuTime)
        || signal == Some(libc::SIGXCPU)
        || (signal == Some(libc::SIGKILL) && cpu_exhausted)
    {
        (Status::Timeout, Some(LimitKind::CpuTime))
    } else if truncated {
        (Status::OutputLimit, Some(LimitKind::Output))
    } else if let Some(sig) = signal {
        (
            Status::Signaled,
            if sig == libc::SIGXFSZ {
                Some(LimitKind::FileSize)
            } else {
                pids
            },
        )
    } else if exit_code != Some(0) {
        (Status::RuntimeError, pids)
    } else {
        (Status::Ok, pids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `classify` with no kill, no signal, exit 0 and nothing hit, but for `f`'s changes.
    fn c(
        f: impl FnOnce(&mut (bool, Option<Kill>, Option<i32>, bool, bool, bool)),
    ) -> (Status, Option<LimitKind>) {
        // (oom, killed, signal, cpu_exhausted, truncated, pids_hit); exit 0 unless signalled
        let mut a = (false, None, None, false, false, false);
        f(&mut a);
        let code = if a.2.is_some() { None } else { Some(0) };
        classify(a.0, a.1, a.2, code, a.3, a.4, a.5)
    }

    #[test]
    fn each_outcome_alone() {
        use LimitKind as L;
        assert_eq!(c(|_| {}), (Status::Ok, None));
        assert_eq!(c(|a| a.5 = true), (Status::Ok, Some(L::Pids)));
        assert_eq!(c(|a| a.0 = true), (Status::MemoryLimit, Some(L::Memory)));
        assert_eq!(
            c(|a| a.1 = Some(Kill::Output)),
            (Status::OutputLimit, Some(L::Output))
        );
        assert_eq!(
            c(|a| a.1 = Some(Kill::WallTime)),
            (Status::Timeout, Some(L::WallTime))
        );
        assert_eq!(
            c(|a| a.1 = Some(Kill::CpuTime)),
            (Status::Timeout, Some(L::CpuTime))
        );
        assert_eq!(
            c(|a| a.2 = Some(libc::SIGXCPU)),
            (Status::Timeout, Some(L::CpuTime))
        );
        assert_eq!(c(|a| a.4 = true), (Status::OutputLimit, Some(L::Output)));
        assert_eq!(
            c(|a| a.2 = Some(libc::SIGXFSZ)),
            (Status::Signaled, Some(L::FileSize))
        );
        assert_eq!(c(|a| a.2 = Some(libc::SIGSEGV)), (Status::Signaled, None));
        assert_eq!(
            classify(false, None, None, Some(3), false, false, true),
            (Status::RuntimeError, Some(L::Pids))
        );
        // A SIGKILL is CPU time only once the budget was spent; otherwise just a signal.
        assert_eq!(c(|a| a.2 = Some(libc::SIGKILL)), (Status::Signaled, None));
        assert_eq!(
            c(|a| (a.2, a.3) = (Some(libc::SIGKILL), true)),
            (Status::Timeout, Some(L::CpuTime))
        );
        // A cancelled run is judged by what it did.
        assert_eq!(
            c(|a| (a.1, a.2) = (Some(Kill::Cancelled), Some(libc::SIGKILL))),
            (Status::Signaled, None)
        );
    }

    #[test]
    fn precedence() {
        use LimitKind as L;
        let all = |a: &mut (bool, Option<Kill>, Option<i32>, bool, bool, bool)| {
            *a = (
                true,
                Some(Kill::WallTime),
                Some(libc::SIGKILL),
                true,
                true,
                true,
            )
        };
        assert_eq!(c(all), (Status::MemoryLimit, Some(L::Memory)));
        assert_eq!(
            c(|a| {
                all(a);
                a.0 = false;
                a.1 = Some(Kill::Output)
            }),
            (Status::OutputLimit, Some(L::Output))
        );
        assert_eq!(
            c(|a| {
                all(a);
                a.0 = false
            }),
            (Status::Timeout, Some(L::WallTime))
        );
        assert_eq!(
            c(|a| {
                all(a);
                (a.0, a.1) = (false, None)
            }),
            (Status::Timeout, Some(L::CpuTime))
        );
        assert_eq!(
            c(|a| *a = (false, None, Some(libc::SIGXFSZ), false, true, true)),
            (Status::OutputLimit, Some(L::Output))
        );
        assert_eq!(
            c(|a| *a = (false, None, Some(libc::SIGXFSZ), false, false, true)),
            (Status::Signaled, Some(L::FileSize))
        );
    }
}
