//! The sandbox: a set of slots, each a thread that owns one box's worth of isolation.
//!
//! A slot is created lazily, at most `max_concurrency` of them: when the queued runs outnumber
//! the slots that are not busy (the caller does not wait for it; the other slots serve the
//! run meanwhile). It lives until the sandbox closes. It owns everything that is slow to
//! create and safe to reuse: a private mount namespace holding the read-only root template, an
//! empty network namespace, a cgroup (or one per v1 controller), a host uid/gid of its own and
//! the child stack. A run is handed to an
//! idle slot through a queue; the caller blocks (without the GIL, in the Python binding)
//! until the slot replies. One slot runs one box at a time, so no two live boxes ever share a
//! network namespace, a cgroup or a host identity.
//!
//! Layout: [`Sandbox`], the handle (here), `shared` (what the handle and the slots share: the
//! queue, the cancel flags), `prepare` (a request checked and converted: `Prepared`), `slot`
//! (the slot thread: `Slot`, its set-up and its loop).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::cgroup;
use crate::config::{self, RunRequest, SandboxConfig};
use crate::error::{Error, Result};
use crate::mounts::Layout;
use crate::seccomp::{Filter, Policy};
use crate::session::Session;
use crate::verdict::ExecResult;

mod prepare;
mod shared;
mod slot;

use prepare::prepare;
pub(crate) use prepare::Prepared;
pub(crate) use shared::Shared;
use shared::{Inflight, Job, Queue, Reply};
use slot::start_slot;
pub(crate) use slot::Slot;

/// An isolated execution environment for untrusted programs. Cheap to share: clone the handle
/// or call [`Sandbox::run`] from many threads at once.
pub struct Sandbox {
    shared: Arc<Shared>,
}

impl Sandbox {
    /// Checks the host, compiles the seccomp policy and starts the first slot, so that any
    /// set-up problem is reported here rather than on the first run.
    pub fn new(config: SandboxConfig) -> Result<Sandbox> {
        config.limits.validate()?;
        if config.max_concurrency == 0 || config.max_concurrency > 4096 {
            return Err(Error::invalid(
                "max_concurrency",
                "must be between 1 and 4096",
            ));
        }
        for (k, v) in &config.env {
            config::env_entry(k, v)?;
        }
        crate::preflight::check()?;
        let layout = Layout::discover(&config)?;
        let base_env = config
            .env
            .iter()
            .map(|(k, v)| config::env_entry(k, v))
            .collect::<Result<Vec<_>>>()?;
        if let Some(w) = &config.warm {
            if w.argv.is_empty() {
                return Err(Error::invalid("warm", "the interpreter command is empty"));
            }
            if !w.core_module.is_file() {
                return Err(Error::invalid(
                    "warm",
                    format!("extension module {} not found", w.core_module.display()),
                ));
            }
        }
        let ids = crate::ids::IdSpace::for_this_process(config.host_id_base)
            .map_err(|e| Error::setup(format!("{e}; see {}", crate::preflight::DOCS)))?;
        let filter = Filter::compile(&Policy {
            allow_network: config.network,
        });
        let cgroups = match cgroup::Manager::new(config.cgroup_parent.as_deref()) {
            Ok(m) => Some(m),
            Err(e) if config.degraded => {
                let _ = e;
                None
            }
            Err(e) => {
                let read_only = e
                    .source
                    .as_ref()
                    .is_some_and(|s| s.raw_os_error() == Some(libc::EROFS));
                let hint = if read_only {
                    "the cgroup file system is mounted read-only (as in a container started \
                     without --privileged); "
                } else {
                    ""
                };
                return Err(Error::setup(format!(
                    "{e}; {hint}memory and pids limits need cgroups (pass degraded=True to \
                     accept rlimit-only limits; see {})",
                    crate::preflight::DOCS
                )));
            }
        };
        let fd_room = crate::rlimit::make_room_for_slots(config.max_concurrency);
        let cap_last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40);
        let shared = Arc::new(Shared {
            config,
            layout,
            filter,
            cgroup_version: cgroups.as_ref().map(|m| m.version()),
            cgroups: Mutex::new(cgroups),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                busy: 0,
                slots: 0,
                next_index: 0,
                closed: false,
                no_growth_until: None,
            }),
            cv: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            cap_last,
            ids,
            // SAFETY: prctl with a query only.
            host_dumpable: unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) } == 1,
            base_env,
            sessions: Mutex::new(None),
            owner_pid: std::process::id(),
            inflight: Mutex::new(HashMap::new()),
            next_run: AtomicU64::new(0),
            warm_asked: AtomicBool::new(false),
            _fd_room: fd_room,
        });
        start_slot(&shared, true)?;
        Ok(Sandbox { shared })
    }

    /// The configuration this sandbox was made with.
    pub fn config(&self) -> &SandboxConfig {
        &self.shared.config
    }

    /// Which cgroup version enforces memory and pids (`None` in degraded mode).
    pub fn cgroup_version(&self) -> Option<cgroup::Version> {
        self.shared.cgroup_version
    }

    /// Whether this handle is a copy inherited through `fork()` (see `Shared::owner_pid`).
    fn forked(&self) -> bool {
        std::process::id() != self.shared.owner_pid
    }

    fn refuse_if_forked(&self) -> Result<()> {
        if self.forked() {
            return Err(Error::setup(format!(
                "this sandbox belongs to process {}: a child made with fork() cannot use it \
                 (its slot threads stayed in the parent); create a new sandbox in the child",
                self.shared.owner_pid
            )));
        }
        Ok(())
    }

    /// Runs one program in a fresh box and returns its verdict. Blocks the calling thread.
    pub fn run(&self, req: RunRequest) -> Result<ExecResult> {
        self.run_interruptible(req, Duration::MAX, || false)
    }

    /// [`Sandbox::run`] that asks `interrupted` about every `every` while it waits: once it
    /// answers true, the run is cancelled (its box killed, as with [`RunRequest::cancel`]) and
    /// the verdict, `sandbox_error`, comes back shortly after. For a binding that must notice
    /// a Ctrl-C while a long run blocks its thread.
    pub fn run_interruptible(
        &self,
        mut req: RunRequest,
        every: Duration,
        mut interrupted: impl FnMut() -> bool,
    ) -> Result<ExecResult> {
        self.refuse_if_forked()?;
        let cancel = req
            .cancel
            .get_or_insert_with(|| Arc::new(AtomicBool::new(false)))
            .clone();
        let prepared = prepare(&self.shared.config, req)?;
        if prepared.warm {
            self.shared.warm_asked.store(true, Ordering::Relaxed);
        }
        let _registered = Inflight::register(&self.shared, &cancel);
        let reply = Arc::new(Reply {
            slot: Mutex::new(None),
            cv: Condvar::new(),
        });
        {
            let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.closed {
                return Err(Error::Closed);
            }
            q.jobs.push_back(Job {
                run: prepared,
                reply: reply.clone(),
            });
            // A slot is added only when the queued jobs outnumber the slots that are not busy.
            // (Counting only the slots waiting on the queue would add one whenever a caller
            // submits again the moment its reply wakes it, before its slot is back: 8 callers
            // grew a sandbox to all its 16 slots, each new one booting a warm interpreter.)
            let grow = q.jobs.len() > q.slots - q.busy
                && q.slots < self.shared.config.max_concurrency
                && q.no_growth_until
                    .is_none_or(|t| std::time::Instant::now() >= t);
            drop(q);
            self.shared.cv.notify_one();
            if grow {
                // Not waited for, and a failure to add a slot is not fatal: the existing slots
                // serve the job.
                let _ = start_slot(&self.shared, false);
            }
        }
        let mut slot = reply.slot.lock().unwrap_or_else(|e| e.into_inner());
        while slot.is_none() {
            if every == Duration::MAX {
                slot = reply.cv.wait(slot).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let (s, timeout) = reply
                .cv
                .wait_timeout(slot, every)
                .unwrap_or_else(|e| e.into_inner());
            slot = s;
            if timeout.timed_out() && slot.is_none() && !cancel.load(Ordering::SeqCst) {
                drop(slot);
                if interrupted() {
                    cancel.store(true, Ordering::SeqCst);
                }
                slot = reply.slot.lock().unwrap_or_else(|e| e.into_inner());
            }
        }
        Ok(slot.take().expect("checked above"))
    }

    /// Creates a session: a work dir that persists across runs (see [`crate::session`]).
    /// `disk_bytes` bounds what each stage (between snapshots and resets) may write.
    pub fn session(&self, files: Vec<(String, Vec<u8>)>, disk_bytes: u64) -> Result<Session> {
        self.refuse_if_forked()?;
        if disk_bytes < 64 << 10 {
            return Err(Error::invalid(
                "disk_bytes",
                format!("must be at least 65536, got {disk_bytes}"),
            ));
        }
        let mut parsed = Vec::with_capacity(files.len());
        for (name, data) in files {
            parsed.push((config::relative_path("files", &name)?, data));
        }
        let manager = {
            let mut m = self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if self
                .shared
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .closed
            {
                return Err(Error::Closed);
            }
            match m.as_ref() {
                Some(m) => m.clone(),
                None => {
                    let new = Arc::new(crate::session::Manager::new()?);
                    *m = Some(new.clone());
                    new
                }
            }
        };
        let ids = &self.shared.ids;
        let claim = ids
            .claim("session", ids.sessions)
            .map_err(|e| Error::setup_io("claiming a host id for the session", e))?;
        let host_id = ids
            .base
            .checked_add(ids.session_offset + claim.index)
            .ok_or_else(|| Error::invalid("host_id_base", "too large"))?;
        Session::create(manager, host_id, parsed, disk_bytes, claim)
    }

    /// [`Sandbox::close`] that first cancels every run waiting or in flight (their boxes are
    /// killed, their verdicts `sandbox_error`) instead of letting them finish: for a process
    /// on its way out.
    pub fn close_now(&self) {
        if self.forked() {
            return;
        }
        for c in self
            .shared
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            c.store(true, Ordering::SeqCst);
        }
        self.close();
    }

    /// Stops the slots after the queued runs finish, and removes the cgroups.
    pub fn close(&self) {
        if self.forked() {
            // The threads, processes and cgroups are the parent's (and a lock copied by fork
            // may be held forever): nothing here is ours to stop.
            return;
        }
        {
            let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.closed = true;
        }
        self.shared.cv.notify_all();
        let threads: Vec<_> = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
        // A slot that was still starting when `closed` was set exits on its own: wait for it.
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        while q.slots > 0 {
            q = self.shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        drop(q);
        if let Some(m) = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            m.close();
        }
        // Every slot cgroup is gone; remove the sandbox's base cgroups.
        drop(
            self.shared
                .cgroups
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }

    /// Validates `req` as [`Sandbox::run`] does, without running it (a scheduler refuses a bad
    /// request when it is submitted). A session's own checks are left to the run.
    pub fn check(&self, req: &RunRequest) -> Result<()> {
        let req = RunRequest {
            session: None,
            ..req.clone()
        };
        prepare(&self.shared.config, req).map(drop)
    }

    /// Number of slots alive.
    pub fn slots(&self) -> usize {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slots
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.forked() {
            // Dropping the shared state here would remove the parent's cgroups (and kill what
            // runs in them): this copy's share is leaked instead.
            std::mem::forget(Arc::clone(&self.shared));
            return;
        }
        self.close();
    }
}
