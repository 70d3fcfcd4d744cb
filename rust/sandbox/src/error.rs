//! The crate's error type.
//!
//! Two kinds of failure exist: the caller asked for something invalid (`InvalidArgument`,
//! which names the offending field), or the host cannot provide what the sandbox needs
//! (`Setup`, which says what is missing). A failure *inside* a run is never an `Error`: it is
//! a verdict with status `sandbox_error` (infrastructure) or the program's own status.

use std::fmt;

/// Every error this crate returns.
#[derive(Debug)]
pub enum Error {
    /// A caller-supplied value is invalid; `field` names it.
    InvalidArgument { field: String, message: String },
    /// The host lacks something the sandbox needs (a kernel feature, a cgroup controller,
    /// privileges); `what` says what, in words a user can act on.
    Setup {
        what: String,
        source: Option<std::io::Error>,
    },
    /// The sandbox was closed.
    Closed,
}

impl Error {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }

    pub(crate) fn setup(what: impl Into<String>) -> Self {
        Error::Setup {
            what: what.into(),
            source: None,
        }
    }

    pub(crate) fn setup_io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Setup {
            what: what.into(),
            source: Some(source),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument { field, message } => write!(f, "invalid {field}: {message}"),
            Error::Setup {
                what,
                source: Some(e),
            } => write!(f, "sandbox set-up failed: {what}: {e}"),
            Error::Setup { what, source: None } => write!(f, "sandbox set-up failed: {what}"),
            Error::Closed => write!(f, "the sandbox is closed"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Setup {
                source: Some(e), ..
            } => Some(e),
            _ => None,
        }
    }
}

/// Shorthand result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
