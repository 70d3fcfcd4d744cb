//! The verdict's status: which limit, if any, ended the run ([`classify`]).

use crate::supervise::Kill;
use crate::verdict::{LimitKind, Status};

/// The status and the limit that decided it, in order of precedence.
pub(super) fn classify(
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
