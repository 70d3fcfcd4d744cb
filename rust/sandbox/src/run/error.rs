//! Why a run could not be carried out ([`RunError`]): the phase that failed ([`Phase`]) and
//! what went wrong there ([`Cause`]). `run_in_slot` makes it the message of a `sandbox_error`
//! verdict: the phase, then the cause, e.g. `launching the box: clone: Resource temporarily
//! unavailable (os error 11)`.

use std::fmt;
use std::io;

use crate::cgroup::CgroupError;

/// The phases of a run that can fail, in the order `run_inner` goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The run's checks, and the slot's warm interpreter for a warm run.
    Start,
    /// The run's tmpfs with its input files, its stdin, pipes and socket.
    Io,
    /// The cgroup the run goes in, and its limits.
    Place,
    /// The box, up to the start of the program.
    Launch,
    /// Watching the program: only a cancellation ends it without a verdict.
    Watch,
    /// The box's end: its exit status, its files, what it left.
    Collect,
    /// The run's figures, read from its cgroup.
    Measure,
}

impl Phase {
    /// What the phase does, for messages.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Phase::Start => "starting the run",
            Phase::Io => "preparing the run's files and pipes",
            Phase::Place => "placing the run in its cgroup",
            Phase::Launch => "launching the box",
            Phase::Watch => "watching the run",
            Phase::Collect => "collecting the run's end",
            Phase::Measure => "measuring the run",
        }
    }
}

/// What went wrong, without the phase (which the caller of a phase adds, see [`Cause::at`]).
#[derive(Debug)]
pub(crate) enum Cause {
    /// A system call failed while doing `what`.
    Io {
        what: &'static str,
        source: io::Error,
    },
    /// A cgroup operation failed while doing `what`.
    Cgroup {
        what: &'static str,
        source: CgroupError,
    },
    /// Anything else, in words.
    Message(String),
}

impl Cause {
    /// An [`io::Error`] mapper for `.map_err`: the failure of `what`.
    pub(crate) fn io(what: &'static str) -> impl Fn(io::Error) -> Cause {
        move |source| Cause::Io { what, source }
    }

    /// A [`CgroupError`] mapper for `.map_err`: the failure of `what`.
    pub(crate) fn cgroup(what: &'static str) -> impl Fn(CgroupError) -> Cause {
        move |source| Cause::Cgroup { what, source }
    }

    /// This cause, in `phase`.
    pub(crate) fn at(self, phase: Phase) -> RunError {
        RunError { phase, cause: self }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Io { what, source } => write!(f, "{what}: {source}"),
            Cause::Cgroup { what, source } => write!(f, "{what}: {source}"),
            Cause::Message(m) => f.write_str(m),
        }
    }
}

impl From<String> for Cause {
    fn from(m: String) -> Cause {
        Cause::Message(m)
    }
}

impl From<&str> for Cause {
    fn from(m: &str) -> Cause {
        Cause::Message(m.to_owned())
    }
}

/// A run that failed for the sandbox's own reasons (not the program's): where, and why.
#[derive(Debug)]
pub(crate) struct RunError {
    pub phase: Phase,
    pub cause: Cause,
}

/// A `.map_err` for a phase's result: its [`Cause`] in `phase`.
pub(crate) fn at(phase: Phase) -> impl FnOnce(Cause) -> RunError {
    move |cause| cause.at(phase)
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.phase.describe(), self.cause)
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            Cause::Io { source, .. } => Some(source),
            Cause::Cgroup { source, .. } => Some(source),
            Cause::Message(_) => None,
        }
    }
}
