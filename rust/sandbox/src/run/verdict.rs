//! The measuring phase and the verdict ([`measure`]): the run's figures (CPU time, peak
//! memory) from its cgroup or its rusage, and its status, decided by which limit, if any,
//! ended it ([`classify`]); and the verdict of a program that could not be executed
//! ([`cannot_execute`]).

use super::collect::Ended;
use super::error::Cause;
use super::place::Placement;
use super::thread_cpu_ns;
use super::watch::Watched;
use crate::sandbox::{Prepared, Slot};
use crate::spawn::Step;
use crate::verdict::{classify, ExecResult, Status};

/// The measuring phase: waits for the live output to be written, reads the run's figures,
/// frees the run's own cgroup and makes the verdict.
pub(super) fn measure(
    slot: &Slot,
    run: &Prepared,
    placed: Placement,
    watched: Watched,
    ended: Ended,
) -> Result<ExecResult, Cause> {
    let l = &run.limits;
    let Watched {
        supervised: w,
        mut out,
        mut err,
        tee,
        wall,
    } = watched;
    let Ended {
        exit,
        files,
        truncated_files,
        was_warm,
    } = ended;
    // Live output: everything read is queued; wait until it is written.
    (out.tee, err.tee) = (None, None);
    if let Some(t) = tee {
        t.finish(crate::tee::FINISH_WAIT);
    }
    let usage = match placed.cgroup(slot) {
        Some(cg) => Some(
            cg.usage()
                .map_err(Cause::cgroup("reading the run's cgroup"))?,
        ),
        None => None,
    };
    let Placement {
        own_cg,
        baseline,
        thread_cpu0,
    } = placed;
    // Not charged the warm interpreter: nothing to take off its peak.
    let baseline = if own_cg.is_some() { 0 } else { baseline };
    // The box is reaped: its cgroup goes now (its leftover tmpfs pages go with the run's file
    // system, freed before the slot's next run).
    drop(own_cg);
    let rusage_cpu = tv(&exit.rusage.ru_utime) + tv(&exit.rusage.ru_stime);
    let cpu_time_s = match &usage {
        Some(u) => {
            let own = thread_cpu_ns().saturating_sub(thread_cpu0);
            (u.cpu_time_ns.saturating_sub(own) as f64 / 1e9).max(rusage_cpu)
        }
        None => rusage_cpu,
    };
    // The slot cgroup's figure (exact, or a lower bound where the kernel cannot reset the
    // peak). Without a cgroup (degraded), the rusage of a warm run's fork (the interpreter's
    // pages it shares count); a cold box's pid 1 starts as a CLONE_VM child of this process,
    // so its rusage would be this process's size, and none is given.
    let (peak, peak_exact) = match &usage {
        Some(u) => (
            u.peak_memory_bytes.map(|p| p.saturating_sub(baseline)),
            u.peak_memory_exact,
        ),
        None if was_warm => (Some(exit.rusage.ru_maxrss as u64 * 1024), false),
        None => (None, false),
    };
    let st = exit.wait_status;
    let (exit_code, signal) = if libc::WIFEXITED(st) {
        (Some(libc::WEXITSTATUS(st)), None)
    } else {
        (None, Some(libc::WTERMSIG(st)))
    };
    let oom = usage.as_ref().map(|u| u.oom_killed).unwrap_or(false);
    let pids_hit = usage.as_ref().map(|u| u.pids_limit_hit).unwrap_or(false);
    let (status, limit) = classify(
        oom,
        w.killed,
        signal,
        exit_code,
        cpu_time_s >= l.cpu_time_s,
        out.truncated() || err.truncated(),
        pids_hit,
    );
    Ok(ExecResult {
        status,
        exit_code,
        signal,
        stdout_truncated: out.truncated(),
        stderr_truncated: err.truncated(),
        stdout: std::mem::take(&mut out.data),
        stderr: std::mem::take(&mut err.data),
        wall_time_s: wall,
        cpu_time_s,
        peak_memory_bytes: peak,
        peak_memory_exact: peak.is_some() && peak_exact,
        limit,
        denied_syscalls: w.denied,
        files,
        truncated_files,
        error: None,
    })
}

/// The verdict of a program that could not be executed, or whose working directory could
/// not be entered (`step`, `errno`): the caller's mistake, not the sandbox's, told as a shell
/// tells it (exit code 127 or 126, a line on stderr, also sent to the live output).
pub(super) fn cannot_execute(run: &Prepared, step: Step, errno: i32) -> ExecResult {
    let err = std::io::Error::from_raw_os_error(errno);
    let mut r = ExecResult::sandbox_error("");
    r.status = Status::RuntimeError;
    r.error = None;
    r.exit_code = Some(if step == Step::Exec { 127 } else { 126 });
    r.stderr = if step == Step::Exec {
        format!(
            "agentrl: cannot execute {}: {err}\n",
            run.argv[0].to_string_lossy()
        )
    } else {
        format!(
            "agentrl: cannot enter the working directory {}: {err}\n",
            run.cwd.to_string_lossy()
        )
    }
    .into_bytes();
    // Live output shows it too: it stands for what the program would have said.
    if let Some((tee, out, err)) = run.tee.lock().unwrap_or_else(|e| e.into_inner()).take() {
        err.send(&r.stderr);
        drop((out, err));
        tee.finish(crate::tee::FINISH_WAIT);
    }
    r
}

fn tv(t: &libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}
