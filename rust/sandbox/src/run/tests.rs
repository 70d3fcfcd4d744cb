//! The verdict's precedence of limits; the message of a run's failure.

use super::error::{Cause, Phase};
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

#[test]
fn a_failure_names_its_phase_and_keeps_its_cause_and_its_advice() {
    let e = Cause::io("pipe")(std::io::Error::from_raw_os_error(libc::EMFILE)).at(Phase::Io);
    let m = e.to_string();
    assert!(
        m.starts_with("preparing the run's files and pipes: pipe: ")
            && m.ends_with("(os error 24)"),
        "{m}"
    );
    assert!(std::error::Error::source(&e).is_some());
    // Running out of fds is still explained, as before the phases had names.
    let m = crate::rlimit::explain_fd_exhaustion(m);
    assert!(m.contains("RLIMIT_NOFILE"), "{m}");
    let e = Cause::from("the run was cancelled").at(Phase::Watch);
    assert_eq!(e.to_string(), "watching the run: the run was cancelled");
    assert!(std::error::Error::source(&e).is_none());
}
