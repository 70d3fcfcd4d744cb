//! The message of a run's failure (the verdict's precedence of limits is tested with
//! [`crate::verdict::classify`]).

use super::error::{Cause, Phase};

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
