//! The one error map: every crate error reaches Python through [`to_py`], as an exception of
//! the tree rooted at `AgentRLError`, or as `InvalidArgument`, a `ValueError` whose `field`
//! names what the caller got wrong (so a front end, like the CLI, can name its own flag).

use std::fmt::Display;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

use agentrl_sandbox as sb;

create_exception!(
    _core,
    AgentRLError,
    PyException,
    "Base class of every agentrl error."
);
create_exception!(
    _core,
    SandboxError,
    AgentRLError,
    "The sandbox could not be set up or used."
);
create_exception!(
    _core,
    InvalidArgument,
    PyValueError,
    "A value the caller gave is invalid: `field` names it and `reason` says what is wrong."
);

/// Maps a crate error to the Python exception tree.
pub(crate) fn to_py(e: sb::Error) -> PyErr {
    to_py_in("", e)
}

/// [`to_py`], the message starting with `context` (e.g. `"job 3: "` for one of a batch).
pub(crate) fn to_py_in(context: &str, e: sb::Error) -> PyErr {
    match e {
        sb::Error::InvalidArgument { field, message } => {
            let text = if sb::Limits::FIELDS.contains(&field.as_str()) {
                format!("{context}Limits.{field} {message}")
            } else {
                format!("{context}{field}: {message}")
            };
            invalid_text(&field, &message, text)
        }
        sb::Error::Setup { .. } | sb::Error::Closed => {
            SandboxError::new_err(format!("{context}{e}"))
        }
    }
}

/// `InvalidArgument` for `field`, saying `reason`.
pub(crate) fn invalid(field: &str, reason: impl Display) -> PyErr {
    let reason = reason.to_string();
    let text = format!("{field}: {reason}");
    invalid_text(field, &reason, text)
}

fn invalid_text(field: &str, reason: &str, text: String) -> PyErr {
    let err = InvalidArgument::new_err(text);
    Python::attach(|py| {
        let value = err.value(py);
        // Setting an attribute on a fresh exception instance cannot fail but for memory;
        // the message still says everything then.
        let _ = value.setattr("field", field);
        let _ = value.setattr("reason", reason);
    });
    err
}

/// Registers the exception types.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("AgentRLError", m.py().get_type::<AgentRLError>())?;
    m.add("SandboxError", m.py().get_type::<SandboxError>())?;
    m.add("InvalidArgument", m.py().get_type::<InvalidArgument>())?;
    Ok(())
}
