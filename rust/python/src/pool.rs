//! The job scheduler (`agentrl-scheduler`) as Python classes.
//!
//! * `Pool` runs sandbox requests on a shared [`sb::Sandbox`] from the scheduler's worker
//!   threads: a verdict with status `sandbox_error` is an infrastructure failure (retried up
//!   to `retries` times, then the job is `failed` with the last reason); any other verdict,
//!   the program's own failure included, is the job's result. Cancelling a running job kills
//!   its box (through [`sb::RunRequest::cancel`]).
//! * `_TestPool` runs a fake executor (no-op, sleep, infrastructure fault, panic) for tests
//!   and for measuring the scheduling overhead from Python.
//!
//! Both cross the Python/Rust boundary once per batch: `submit_many(items) -> ids` and
//! `collect(max, timeout) -> [(id, kind, value)]`, where `kind` is one of `"completed"`,
//! `"cancelled"`, `"expired"`, `"failed"` and `value` is the result (`completed`), the reason
//! (`failed`) or `None`. `completion_fd()` is readable while results are pending (for
//! `loop.add_reader`). The GIL is released while submitting, waiting, cancelling and closing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};

use agentrl_sandbox as sb;
use agentrl_scheduler as sched;

use crate::errors::{to_py_in, AgentRLError};
use crate::records::{JobArg, Verdict};
use crate::PySandbox;

mod testing;

create_exception!(
    _core,
    PoolFull,
    AgentRLError,
    "The pool has no room for the job (its capacity is taken)."
);
create_exception!(
    _core,
    PoolClosed,
    AgentRLError,
    "The pool is closed and takes no new jobs."
);

/// Registers the classes and exceptions of this module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPool>()?;
    m.add_class::<testing::TestPool>()?;
    m.add("PoolFull", m.py().get_type::<PoolFull>())?;
    m.add("PoolClosed", m.py().get_type::<PoolClosed>())?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Executors.

/// Runs sandbox requests.
struct SandboxExec {
    sandbox: Arc<sb::Sandbox>,
}

impl sched::Executor for SandboxExec {
    type Job = sb::RunRequest;
    type Output = sb::ExecResult;

    fn execute(
        &self,
        job: &sb::RunRequest,
        cancel: &sched::CancelToken<'_>,
    ) -> Result<sb::ExecResult, sched::InfraError> {
        let flag = Arc::new(AtomicBool::new(false));
        let hook_flag = flag.clone();
        // Registered before the run starts: a cancellation from now on stops the run (or keeps
        // it from starting); the guard is dropped once `run` has returned.
        let _guard = cancel.on_cancel(move || hook_flag.store(true, Ordering::SeqCst));
        let mut req = job.clone();
        req.cancel = Some(flag);
        match self.sandbox.run(req) {
            // Reported as `cancelled` whatever is returned: not an infrastructure failure.
            Ok(r) if cancel.is_cancelled() => Ok(r),
            Ok(r) if r.status == sb::Status::SandboxError => Err(sched::InfraError::new(
                r.error.unwrap_or_else(|| "sandbox error".to_owned()),
            )),
            Ok(r) => Ok(r),
            Err(e) => Err(sched::InfraError::new(e.to_string())),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared plumbing.

fn config(
    workers: usize,
    capacity: usize,
    retries: u32,
    block_timeout: Option<f64>,
    thread_name: &str,
) -> PyResult<sched::Config> {
    if capacity == 0 || capacity > u32::MAX as usize {
        return Err(PyValueError::new_err(format!(
            "capacity must be between 1 and {}, got {capacity}",
            u32::MAX
        )));
    }
    if workers > 4096 {
        return Err(PyValueError::new_err(format!(
            "workers must be at most 4096, got {workers}"
        )));
    }
    let backpressure = match block_timeout {
        None => sched::Backpressure::Error,
        Some(t) if t.is_finite() && t >= 0.0 => {
            sched::Backpressure::Block(Duration::from_secs_f64(t.min(1e9)))
        }
        Some(t) => {
            return Err(PyValueError::new_err(format!(
                "block timeout must be a non-negative number, got {t}"
            )))
        }
    };
    Ok(sched::Config {
        workers,
        capacity,
        retries,
        backpressure,
        thread_name: thread_name.to_owned(),
    })
}

fn new_pool<E: sched::Executor>(
    py: Python<'_>,
    executor: E,
    config: sched::Config,
) -> PyResult<Arc<sched::Pool<E>>> {
    py.detach(|| sched::Pool::new(executor, config))
        .map(Arc::new)
        .map_err(|e| AgentRLError::new_err(format!("starting the pool: {e}")))
}

/// A job spec from its scheduling attributes; `deadline` is in seconds from now.
fn spec<J>(
    payload: J,
    group: u64,
    priority: i32,
    deadline: Option<f64>,
) -> PyResult<sched::JobSpec<J>> {
    let mut s = sched::JobSpec::new(payload).group(group).priority(priority);
    match deadline {
        None => {}
        Some(d) if d.is_nan() => return Err(PyValueError::new_err("deadline is NaN")),
        Some(d) if d == f64::INFINITY => {}
        Some(d) => {
            let now = Instant::now();
            let at = if d <= 0.0 {
                Some(now)
            } else {
                Duration::try_from_secs_f64(d)
                    .ok()
                    .and_then(|d| now.checked_add(d))
            };
            if let Some(at) = at {
                s = s.deadline(at);
            }
        }
    }
    Ok(s)
}

/// Batches up to this size are submitted without releasing the GIL: handing it over costs
/// more than the submission, and lets a thread waiting for it (the dispatcher) in for each
/// job. The submission does not wait on anything that needs the GIL.
const SMALL_BATCH: usize = 32;

/// Runs `f` without the GIL if `n` is more than a small batch.
fn maybe_detach<T: Send>(py: Python<'_>, n: usize, f: impl FnOnce() -> T + Send) -> T {
    if n > SMALL_BATCH {
        py.detach(f)
    } else {
        f()
    }
}

fn submit<E: sched::Executor>(
    py: Python<'_>,
    pool: &sched::Pool<E>,
    specs: Vec<sched::JobSpec<E::Job>>,
) -> PyResult<Vec<u64>> {
    match maybe_detach(py, specs.len(), || pool.submit_many(specs)) {
        Ok(ids) => Ok(ids.into_iter().map(u64::from).collect()),
        Err(e) => {
            let accepted: Vec<u64> = e.accepted.iter().map(|&i| u64::from(i)).collect();
            let msg = e.to_string();
            Err(match e.reason {
                sched::RejectReason::Full => PoolFull::new_err((msg, accepted)),
                sched::RejectReason::Closed => PoolClosed::new_err((msg, accepted)),
            })
        }
    }
}

type Drained<R> = Vec<(sched::JobId, sched::Outcome<R>)>;

fn drain<E: sched::Executor>(
    py: Python<'_>,
    pool: &sched::Pool<E>,
    max: Option<usize>,
    timeout: f64,
) -> PyResult<Drained<E::Output>> {
    let max = max.unwrap_or(usize::MAX);
    if max == 0 {
        return Ok(Vec::new());
    }
    if timeout.is_nan() || timeout < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number, got {timeout}"
        )));
    }
    let out = pool.drain(max);
    if !out.is_empty() || timeout == 0.0 {
        return Ok(out);
    }
    let wait = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX);
    Ok(py.detach(|| {
        let mut out = Vec::new();
        if let Some(first) = pool.wait_result(wait) {
            out.push(first);
            pool.drain_into(&mut out, max - 1);
        }
        out
    }))
}

/// How `collect` shapes one result: `(id, kind, value)` with `kind` a string, or, once the
/// Python side has given its record type, an instance of that tuple subclass made of
/// `(id, status, result, reason)` with its own four status objects (no per-result work left
/// for Python).
struct Shape {
    new: Py<PyAny>,
    cls: Py<PyAny>,
    kinds: [Py<PyAny>; 4],
}

type ShapeArg<'py> = (
    Bound<'py, PyType>,
    (
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
    ),
);

fn shape(py: Python<'_>, arg: Option<ShapeArg<'_>>) -> PyResult<Option<Shape>> {
    let Some((cls, (a, b, c, d))) = arg else {
        return Ok(None);
    };
    if !cls.is_subclass_of::<PyTuple>()? {
        return Err(PyValueError::new_err("outcome type must subclass tuple"));
    }
    Ok(Some(Shape {
        new: py.get_type::<PyTuple>().getattr("__new__")?.unbind(),
        cls: cls.into_any().unbind(),
        kinds: [a.unbind(), b.unbind(), c.unbind(), d.unbind()],
    }))
}

/// The results as Python objects; `completed` makes the value of a completed job.
fn outcomes<'py, R>(
    py: Python<'py>,
    drained: Drained<R>,
    shape: Option<&Shape>,
    mut completed: impl FnMut(Python<'py>, R) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let names = [
        pyo3::intern!(py, "completed"),
        pyo3::intern!(py, "cancelled"),
        pyo3::intern!(py, "expired"),
        pyo3::intern!(py, "failed"),
    ];
    let list = PyList::empty(py);
    for (id, outcome) in drained {
        let id = u64::from(id).into_pyobject(py)?.into_any();
        let none = || py.None().into_bound(py);
        let (k, value, reason) = match outcome {
            sched::Outcome::Completed(r) => (0, completed(py, r)?, none()),
            sched::Outcome::Cancelled => (1, none(), none()),
            sched::Outcome::Expired => (2, none(), none()),
            sched::Outcome::Failed(why) => (3, none(), PyString::new(py, &why).into_any()),
        };
        let item = match shape {
            None => {
                let value = if k == 3 { reason } else { value };
                PyTuple::new(py, [id, names[k].clone().into_any(), value])?.into_any()
            }
            Some(s) => {
                let kind = s.kinds[k].bind(py).clone();
                let fields = PyTuple::new(py, [id, kind, value, reason])?;
                s.new.bind(py).call1((s.cls.bind(py), fields))?
            }
        };
        list.append(item)?;
    }
    Ok(list)
}

fn stats_dict<'py, E: sched::Executor>(
    py: Python<'py>,
    pool: &sched::Pool<E>,
) -> PyResult<Bound<'py, PyDict>> {
    let s = pool.stats();
    let d = PyDict::new(py);
    d.set_item("workers", s.workers)?;
    d.set_item("workers_alive", s.workers_alive)?;
    d.set_item("capacity", s.capacity)?;
    let lanes = PyDict::new(py);
    for (lane, depth) in s.queue_depth.iter().enumerate() {
        lanes.set_item(sched::lane_priority(lane), depth)?;
    }
    d.set_item("queue_depth", lanes)?;
    d.set_item("queued", s.queued())?;
    d.set_item("running", s.running)?;
    d.set_item("pending_results", s.pending_results)?;
    d.set_item("submitted", s.submitted)?;
    d.set_item("completed", s.completed)?;
    d.set_item("cancelled", s.cancelled)?;
    d.set_item("expired", s.expired)?;
    d.set_item("failed", s.failed)?;
    d.set_item("finished", s.finished())?;
    d.set_item("panics", s.panics)?;
    d.set_item("retries", s.retries)?;
    d.set_item("utilisation", s.utilisation)?;
    d.set_item("jobs_per_sec", s.jobs_per_sec)?;
    d.set_item("elapsed_s", s.elapsed.as_secs_f64())?;
    Ok(d)
}

fn cancel_one<E: sched::Executor>(py: Python<'_>, pool: &sched::Pool<E>, id: u64) -> bool {
    py.detach(|| pool.cancel(sched::JobId(id)))
}

fn cancel_group<E: sched::Executor>(py: Python<'_>, pool: &sched::Pool<E>, group: u64) -> usize {
    py.detach(|| pool.cancel_group(group))
}

fn close<E: sched::Executor>(py: Python<'_>, pool: &sched::Pool<E>, drain: bool) {
    py.detach(|| pool.close(drain));
}

// ---------------------------------------------------------------------------------------------
// The sandbox pool.

/// A scheduler pool whose jobs are runs on a sandbox.
#[pyclass(frozen, name = "Pool", module = "agentrl._core")]
struct PyPool {
    pool: Arc<sched::Pool<SandboxExec>>,
    shape: Option<Shape>,
}

#[pymethods]
impl PyPool {
    /// `block_timeout`: None fails a submission at once when the pool is full; a number of
    /// seconds waits that long for room. `outcome`: `(record type, (completed, cancelled,
    /// expired, failed))` to have `collect` build the records (see `Shape`).
    #[new]
    #[pyo3(signature = (sandbox, workers, capacity, retries, block_timeout=None, outcome=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        sandbox: PyRef<'_, PySandbox>,
        workers: usize,
        capacity: usize,
        retries: u32,
        block_timeout: Option<f64>,
        outcome: Option<ShapeArg<'_>>,
    ) -> PyResult<Self> {
        let config = config(workers, capacity, retries, block_timeout, "agentrl-pool")?;
        let exec = SandboxExec {
            sandbox: sandbox.inner.clone(),
        };
        Ok(PyPool {
            shape: shape(py, outcome)?,
            pool: new_pool(py, exec, config)?,
        })
    }

    /// Validates every item (a ValueError names the first bad one; nothing is submitted
    /// then), then submits them in order. Returns the job ids.
    fn submit_many(&self, py: Python<'_>, items: Vec<JobArg>) -> PyResult<Vec<u64>> {
        let sandbox = &self.pool.executor().sandbox;
        let mut specs = Vec::with_capacity(items.len());
        for it in items {
            let req = it.request.into_request()?;
            specs.push(spec(req, it.group, it.priority, it.deadline)?);
        }
        maybe_detach(py, specs.len(), || {
            specs.iter().enumerate().try_for_each(|(i, s)| {
                sandbox
                    .check(&s.payload)
                    .map_err(|e| to_py_in(&format!("job {i}: "), e))
            })
        })?;
        submit(py, &self.pool, specs)
    }

    /// Up to `max` results (all if None); waits up to `timeout` seconds for the first.
    #[pyo3(signature = (max=None, timeout=0.0))]
    fn collect<'py>(
        &self,
        py: Python<'py>,
        max: Option<usize>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyList>> {
        let drained = drain(py, &self.pool, max, timeout)?;
        outcomes(py, drained, self.shape.as_ref(), |py, r| {
            Verdict::into_py(py, r)
        })
    }

    /// Cancels one job; true iff its outcome will be `cancelled`.
    fn cancel(&self, py: Python<'_>, id: u64) -> bool {
        cancel_one(py, &self.pool, id)
    }

    /// Cancels every queued or running job of `group`; returns how many.
    fn cancel_group(&self, py: Python<'_>, group: u64) -> usize {
        cancel_group(py, &self.pool, group)
    }

    /// The eventfd that is readable while results are pending. Never read it.
    fn completion_fd(&self) -> i32 {
        self.pool.completion_fd()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.pool)
    }

    /// Stops the workers (after running what is queued if `drain`, else cancelling it).
    fn close(&self, py: Python<'_>, drain: bool) {
        close(py, &self.pool, drain);
    }

    #[getter]
    fn closed(&self) -> bool {
        self.pool.is_closed()
    }

    #[getter]
    fn workers(&self) -> usize {
        self.pool.workers()
    }
}
