//! `_TestPool`: the scheduler with a fake executor, for tests (fault injection: infrastructure
//! faults, panics, cancellable sleeps) and for measuring the scheduling overhead from Python.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList};

use agentrl_scheduler as sched;

use super::{
    cancel_group, cancel_one, close, config, drain, new_pool, outcomes, shape, spec, stats_dict,
    submit, Shape, ShapeArg,
};

const OP_NOOP: u8 = 0;
const OP_SLEEP: u8 = 1;
const OP_INFRA: u8 = 2;
const OP_FLAKY: u8 = 3;
const OP_PANIC: u8 = 4;

/// The fake executor of `_TestPool`; a job is `(op, arg)`.
struct FakeExec;

impl sched::Executor for FakeExec {
    type Job = (u8, u64);
    type Output = u64;

    fn execute(
        &self,
        &(op, arg): &(u8, u64),
        cancel: &sched::CancelToken<'_>,
    ) -> Result<u64, sched::InfraError> {
        match op {
            OP_SLEEP => {
                let end = Instant::now() + Duration::from_micros(arg);
                let me = std::thread::current();
                let _guard = cancel.on_cancel(move || me.unpark());
                while !cancel.is_cancelled() {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    std::thread::park_timeout(end - now);
                }
                Ok(arg)
            }
            OP_INFRA => Err(sched::InfraError::new("injected infrastructure fault")),
            OP_FLAKY if u64::from(cancel.attempt()) < arg => Err(sched::InfraError::new(format!(
                "injected fault on attempt {}",
                cancel.attempt()
            ))),
            OP_FLAKY => Ok(u64::from(cancel.attempt())),
            // Unwinds without the panic hook, so that tests do not print a backtrace.
            OP_PANIC => std::panic::resume_unwind(Box::new("injected panic")),
            _ => Ok(arg),
        }
    }
}

/// A pool with a fake executor. A job is an int `n` (a no-op whose result is `n`) or a tuple
/// `(op, arg, group, priority, deadline)`; ops: 0 no-op (result `arg`), 1 sleep `arg`
/// microseconds (cancellable), 2 infrastructure fault on every attempt, 3 infrastructure
/// fault on the first `arg` attempts (result: the attempt that succeeded), 4 panic.
#[pyclass(frozen, name = "_TestPool", module = "agentrl._core")]
pub(super) struct TestPool {
    pool: Arc<sched::Pool<FakeExec>>,
    shape: Option<Shape>,
}

#[pymethods]
impl TestPool {
    #[new]
    #[pyo3(signature = (workers, capacity, retries, block_timeout=None, outcome=None))]
    fn new(
        py: Python<'_>,
        workers: usize,
        capacity: usize,
        retries: u32,
        block_timeout: Option<f64>,
        outcome: Option<ShapeArg<'_>>,
    ) -> PyResult<Self> {
        let config = config(
            workers,
            capacity,
            retries,
            block_timeout,
            "agentrl-testpool",
        )?;
        Ok(TestPool {
            shape: shape(py, outcome)?,
            pool: new_pool(py, FakeExec, config)?,
        })
    }

    fn submit_many(&self, py: Python<'_>, items: &Bound<'_, PyList>) -> PyResult<Vec<u64>> {
        let mut specs = Vec::with_capacity(items.len());
        for item in items.iter() {
            if item.is_instance_of::<PyInt>() {
                specs.push(sched::JobSpec::new((OP_NOOP, item.extract::<u64>()?)));
                continue;
            }
            let (op, arg, group, priority, deadline): (u8, u64, u64, i32, Option<f64>) =
                item.extract()?;
            if op > OP_PANIC {
                return Err(PyValueError::new_err(format!("unknown op {op}")));
            }
            specs.push(spec((op, arg), group, priority, deadline)?);
        }
        submit(py, &self.pool, specs)
    }

    #[pyo3(signature = (max=None, timeout=0.0))]
    fn collect<'py>(
        &self,
        py: Python<'py>,
        max: Option<usize>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyList>> {
        let drained = drain(py, &self.pool, max, timeout)?;
        outcomes(py, drained, self.shape.as_ref(), |py, r| {
            Ok(r.into_pyobject(py)?.into_any())
        })
    }

    fn cancel(&self, py: Python<'_>, id: u64) -> bool {
        cancel_one(py, &self.pool, id)
    }

    fn cancel_group(&self, py: Python<'_>, group: u64) -> usize {
        cancel_group(py, &self.pool, group)
    }

    fn completion_fd(&self) -> i32 {
        self.pool.completion_fd()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.pool)
    }

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
