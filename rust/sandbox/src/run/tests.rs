//! The verdict's precedence of limits.

use super::verdict::classify;
use crate::supervise::Kill;
use crate::verdict::{LimitKind, Status};

#[test]
fn precedence() {
    let c = |oom, killed, sig, code, cpu, trunc, pids| {
        classify(oom, killed, sig, code, cpu, trunc, pids)
    };
    assert_eq!(
        c(true, Some(Kill::WallTime), Some(9), None, true, true, true).0,
        Status::MemoryLimit
    );
    assert_eq!(
        c(
            false,
            Some(Kill::WallTime),
            Some(9),
            None,
            true,
            true,
            false
        )
        .1,
        Some(LimitKind::WallTime)
    );
    assert_eq!(
        c(false, None, Some(libc::SIGXCPU), None, false, false, false).1,
        Some(LimitKind::CpuTime)
    );
    assert_eq!(
        c(false, None, Some(9), None, true, false, false).0,
        Status::Timeout
    );
    assert_eq!(
        c(false, None, Some(9), None, false, false, false).0,
        Status::Signaled
    );
    assert_eq!(
        c(false, None, None, Some(0), false, true, false).0,
        Status::OutputLimit
    );
    assert_eq!(
        c(false, None, Some(libc::SIGXFSZ), None, false, false, false).1,
        Some(LimitKind::FileSize)
    );
    assert_eq!(
        c(false, None, None, Some(2), false, false, true),
        (Status::RuntimeError, Some(LimitKind::Pids))
    );
    assert_eq!(
        c(false, None, None, Some(0), false, false, false),
        (Status::Ok, None)
    );
}
