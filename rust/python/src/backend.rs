//! What the nsjail backend (`agentrl.backends.nsjail`) reuses of the core: the verdict's
//! classification ([`classify_verdict`]), so that both backends judge a run by one rule.

use pyo3::prelude::*;

use agentrl_sandbox::verdict::{self, Kill};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(classify_verdict, m)?)?;
    Ok(())
}

/// The status and the limit that decided it (or another limit the run hit), as the native
/// backend classifies its runs: ``(status, limit or None)`` by their Python names.
/// ``killed`` is why the supervisor killed the run: ``"wall_time"``, ``"cpu_time"``,
/// ``"output"`` or None.
#[pyfunction]
#[pyo3(signature = (oom, killed, signal, exit_code, cpu_exhausted, truncated, pids_hit))]
fn classify_verdict(
    oom: bool,
    killed: Option<&str>,
    signal: Option<i32>,
    exit_code: Option<i32>,
    cpu_exhausted: bool,
    truncated: bool,
    pids_hit: bool,
) -> PyResult<(&'static str, Option<&'static str>)> {
    let killed = match killed {
        None => None,
        Some("wall_time") => Some(Kill::WallTime),
        Some("cpu_time") => Some(Kill::CpuTime),
        Some("output") => Some(Kill::Output),
        Some(other) => {
            return Err(crate::errors::invalid(
                "killed",
                format!("must be 'wall_time', 'cpu_time', 'output' or None, got {other:?}"),
            ))
        }
    };
    let (status, limit) = verdict::classify(
        oom,
        killed,
        signal,
        exit_code,
        cpu_exhausted,
        truncated,
        pids_hit,
    );
    Ok((status.as_str(), limit.map(|l| l.as_str())))
}
