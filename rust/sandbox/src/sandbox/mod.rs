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

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cgroup;
use crate::config::{self, RunRequest, SandboxConfig, WORK_DIR};
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::mounts::{CgroupView, ChildPaths, Layout, Template};
use crate::run::run_in_slot;
use crate::seccomp::{Filter, Policy};
use crate::session::Session;
use crate::spawn::ChildStack;
use crate::verdict::ExecResult;
use crate::zygote::Zygote;

/// A run, validated and converted to what the child needs.
pub(crate) struct Prepared {
    pub argv: Vec<CString>,
    pub exec_paths: Vec<CString>,
    pub env: Vec<CString>,
    pub cwd: CString,
    pub stdin: Vec<u8>,
    pub files: Vec<(Vec<String>, Vec<u8>)>,
    pub collect: Vec<(String, Vec<String>)>,
    pub limits: Limits,
    /// Run on the slot's warm interpreter (the program is `/work/__main__.py`).
    pub warm: bool,
    /// For a session step: the overlay to attach at `/work`, and the session's host id.
    pub session: Option<(OwnedFd, u32)>,
    /// See [`RunRequest::cancel`].
    pub cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// See [`RunRequest::pass_fds`]. Taken (and this copy closed) once handed to the warm
    /// interpreter: from then on only the run holds them, so that its end shows at once to
    /// whoever holds the other end of a pipe or socket.
    pub pass_fds: Mutex<Vec<Arc<OwnedFd>>>,
    /// See [`RunRequest::tee`]: the writer and its two senders, taken by the run. Started
    /// here, on the caller's thread: a thread started by the slot's would join the slot's
    /// cgroup (v1) and count against the run's pids limit.
    pub tee: Mutex<
        Option<(
            crate::tee::Tee,
            crate::tee::TeeSender,
            crate::tee::TeeSender,
        )>,
    >,
}

struct Reply {
    slot: Mutex<Option<ExecResult>>,
    cv: Condvar,
}

struct Job {
    run: Prepared,
    reply: Arc<Reply>,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Slots running a job (from taking it to just before its reply): the others are idle,
    /// starting, or back for the next job at once.
    busy: usize,
    slots: usize,
    next_index: usize,
    closed: bool,
    /// After a slot failed to start, no other is tried before this (the existing slots serve
    /// the queue): a cause that lasts would otherwise cost a thread and a network namespace
    /// per queued run.
    no_growth_until: Option<std::time::Instant>,
}

pub(crate) struct Shared {
    pub config: SandboxConfig,
    /// The session manager, started with the first session.
    sessions: Mutex<Option<Arc<crate::session::Manager>>>,
    /// The base environment as C strings (for the warm interpreter).
    pub base_env: Vec<CString>,
    layout: Layout,
    pub filter: Filter,
    /// The cgroup manager; taken (and its base cgroups removed) by `close`.
    cgroups: Mutex<Option<cgroup::Manager>>,
    pub cgroup_version: Option<cgroup::Version>,
    queue: Mutex<Queue>,
    cv: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub cap_last: u32,
    /// The host ids the boxes may use.
    ids: crate::ids::IdSpace,
    /// Whether the host process was dumpable when the sandbox was made: the uid switches of
    /// the spawn path clear that flag, and they restore it.
    pub host_dumpable: bool,
    /// The cancel flags of the runs waiting or in flight, by a per-sandbox number (see
    /// [`Sandbox::close_now`]).
    inflight: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    next_run: AtomicU64,
    /// A warm run has been asked for: slots added from then on start their warm interpreter
    /// before taking a run, rather than with the first one (which would wait for the boot
    /// while the other slots could have served it).
    warm_asked: AtomicBool,
    /// The process that made the sandbox. A child made with `fork()` inherits a copy of this
    /// handle but none of the slot threads behind it: there it refuses runs and leaves the
    /// parent's processes and cgroups alone.
    owner_pid: u32,
    /// This sandbox's share of the room made in the process's open-file limit.
    _fd_room: crate::rlimit::FdRoom,
}

impl Shared {
    /// A fresh cgroup for one run of slot `index` (see [`cgroup::Manager::create_run_cgroup`]);
    /// `None` when the sandbox has no cgroups (degraded).
    pub(crate) fn run_cgroup(
        &self,
        index: usize,
    ) -> std::result::Result<Option<cgroup::Slot>, cgroup::CgroupError> {
        let manager = self.cgroups.lock().unwrap_or_else(|e| e.into_inner());
        manager
            .as_ref()
            .map(|m| m.create_run_cgroup(index))
            .transpose()
    }
}

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

/// A run's cancel flag, listed in `Shared::inflight` while the run waits or runs.
struct Inflight<'a> {
    shared: &'a Shared,
    id: u64,
}

impl<'a> Inflight<'a> {
    fn register(shared: &'a Shared, cancel: &Arc<AtomicBool>) -> Inflight<'a> {
        let id = shared.next_run.fetch_add(1, Ordering::Relaxed);
        shared
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, cancel.clone());
        Inflight { shared, id }
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.shared
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
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

fn prepare(config: &SandboxConfig, req: RunRequest) -> Result<Prepared> {
    let limits = req.limits.unwrap_or_else(|| config.limits.clone());
    limits.validate()?;
    if req.warm && config.warm.is_none() {
        return Err(Error::invalid(
            "warm",
            "this sandbox has no warm interpreter",
        ));
    }
    if req.session.is_some() && req.warm {
        return Err(Error::invalid("warm", "session steps run cold"));
    }
    if req.session.is_some() && !req.files.is_empty() {
        return Err(Error::invalid(
            "files",
            "a session's files are given when it is created; a step writes files with its command",
        ));
    }
    if !req.pass_fds.is_empty() && !req.warm {
        return Err(Error::invalid(
            "pass_fds",
            "only a warm run (run_python) takes fds",
        ));
    }
    if req.pass_fds.len() > config::MAX_PASS_FDS {
        return Err(Error::invalid(
            "pass_fds",
            format!(
                "{} fds given, at most {} can be passed",
                req.pass_fds.len(),
                config::MAX_PASS_FDS
            ),
        ));
    }
    if req.warm && !req.files.iter().any(|(n, _)| n == "__main__.py") {
        return Err(Error::invalid("files", "a warm run needs __main__.py"));
    }
    if req.argv.is_empty() {
        return Err(Error::invalid("argv", "is empty"));
    }
    if req.argv[0].is_empty() {
        return Err(Error::invalid("argv", "argv[0] is empty"));
    }
    let argv = req
        .argv
        .iter()
        .map(|a| config::cstring("argv", a))
        .collect::<Result<Vec<_>>>()?;
    let mut env: Vec<(String, String)> = config.env.clone();
    for (k, v) in req.env {
        config::env_entry(&k, &v)?;
        env.retain(|(k2, _)| *k2 != k);
        env.push((k, v));
    }
    let env_c = env
        .iter()
        .map(|(k, v)| config::env_entry(k, v))
        .collect::<Result<Vec<_>>>()?;
    let prog = &req.argv[0];
    let exec_paths = if prog.contains(&b'/') {
        vec![argv[0].clone()]
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or("/usr/bin:/bin");
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| {
                let mut p = d.trim_end_matches('/').as_bytes().to_vec();
                p.push(b'/');
                p.extend_from_slice(prog);
                config::cstring("argv", &p)
            })
            .collect::<Result<Vec<_>>>()?
    };
    let cwd = match req.cwd {
        None => WORK_DIR.to_string(),
        Some(c) if c.starts_with('/') => {
            config::absolute_box_path("cwd", std::path::Path::new(&c))?
                .to_string_lossy()
                .into_owned()
        }
        Some(c) => format!("{WORK_DIR}/{}", config::relative_path("cwd", &c)?.join("/")),
    };
    let cwd = config::cstring("cwd", cwd.as_bytes())?;
    let mut files = Vec::with_capacity(req.files.len());
    let mut total: u64 = 0;
    for (name, data) in req.files {
        let parts = config::relative_path("files", &name)?;
        total += data.len() as u64;
        files.push((parts, data));
    }
    if total > limits.tmpfs_bytes {
        return Err(Error::invalid(
            "files",
            format!(
                "{total} bytes of input files do not fit the {} byte tmpfs",
                limits.tmpfs_bytes
            ),
        ));
    }
    let collect = req
        .collect
        .into_iter()
        .map(|n| config::relative_path("collect", &n).map(|p| (n, p)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Prepared {
        argv,
        exec_paths,
        env: env_c,
        cwd,
        stdin: req.stdin,
        files,
        collect,
        limits,
        warm: req.warm,
        cancel: req.cancel,
        pass_fds: Mutex::new(req.pass_fds),
        tee: Mutex::new(match req.tee {
            Some(fds) => Some(
                crate::tee::Tee::start(fds)
                    .map_err(|e| Error::setup_io("starting the live-output writer", e))?,
            ),
            None => None,
        }),
        session: match req.session {
            Some(s) => Some((s.step_mount()?, s.host_id)),
            None => None,
        },
    })
}

/// Adds a slot (up to `max_concurrency`). `wait`: until it is ready, returning its set-up
/// error (the first slot, made by [`Sandbox::new`]). Otherwise the caller goes on at once: a
/// slot added because runs are queueing serves them once ready, while the existing slots go
/// on serving them meanwhile; its set-up can take long (creating a network namespace waits
/// for the kernel's clean-up of dead ones, over a second at times), and a failure only means
/// one slot fewer.
fn start_slot(shared: &Arc<Shared>, wait: bool) -> Result<()> {
    let index = {
        let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.closed || q.slots >= shared.config.max_concurrency {
            return Ok(());
        }
        q.slots += 1;
        q.next_index += 1;
        q.next_index - 1
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let sh = shared.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("agentrl-slot-{index}"))
        .spawn(move || slot_main(sh, index, tx));
    let handle = match spawned {
        Ok(h) => h,
        Err(e) => {
            shared.queue.lock().unwrap_or_else(|e| e.into_inner()).slots -= 1;
            return Err(Error::setup_io("starting a slot thread", e));
        }
    };
    let ready = if wait {
        rx.recv()
    } else {
        // Dropping the receiver: the slot's report of its set-up goes nowhere.
        Ok(Ok(()))
    };
    match ready {
        Ok(Ok(())) => {
            shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(handle);
            Ok(())
        }
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => {
            let _ = handle.join();
            Err(Error::setup("the slot thread died while starting"))
        }
    }
}

/// Everything a slot owns.
pub(crate) struct Slot {
    pub paths: ChildPaths,
    pub stack: ChildStack,
    /// The program's own stack (pid 2 of a box, started by pid 1).
    pub stack2: ChildStack,
    pub init_path: CString,
    pub cgroup: Option<cgroup::Slot>,
    /// Host uid/gid of the box user of this slot.
    pub host_id: u32,
    /// Host uid/gid of the slot's warm interpreter (root of its user namespace).
    pub zygote_host_id: u32,
    pub zygote: Option<Zygote>,
    /// Work done between runs, off the callers' critical path.
    pub between: crate::run::Between,
    _ids: crate::ids::Claim,
    _template: Template,
}

fn slot_main(shared: Arc<Shared>, index: usize, ready: std::sync::mpsc::Sender<Result<()>>) {
    let slot = match init_slot(&shared, index) {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            {
                let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.slots -= 1;
                q.no_growth_until = Some(std::time::Instant::now() + Duration::from_secs(1));
            }
            // `close` may be waiting for the slot count to reach 0.
            shared.cv.notify_all();
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut slot = slot;
    if shared.warm_asked.load(Ordering::Relaxed) {
        // A failure here is reported by the first warm run, which tries again.
        let _ = crate::zygote::ensure(&shared, &mut slot);
    }
    loop {
        let job = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    q.busy += 1;
                    break Some(j);
                }
                if q.closed {
                    break None;
                }
                let (guard, timed_out) = shared
                    .cv
                    .wait_timeout(q, std::time::Duration::from_secs(1))
                    .unwrap_or_else(|e| e.into_inner());
                q = guard;
                if timed_out.timed_out()
                    && slot
                        .zygote
                        .as_ref()
                        .is_some_and(|z| !crate::zygote::is_alive(z))
                {
                    // Reap a warm interpreter that died while the slot was idle.
                    slot.zygote = None;
                }
            }
        };
        let Some(job) = job else { break };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_in_slot(&shared, &mut slot, &job.run)
        }))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            ExecResult::sandbox_error(format!("internal error in the supervisor: {msg}"))
        });
        // Not busy any more before the caller learns the result (see `busy`).
        shared.queue.lock().unwrap_or_else(|e| e.into_inner()).busy -= 1;
        *job.reply.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        job.reply.cv.notify_one();
        crate::run::between_runs(&mut slot);
    }
    if let Some(cg) = &slot.cgroup {
        let _ = cg.kill_all();
        let tid = crate::sys::gettid();
        let _ = v1_move_thread(cg, tid, true);
    }
    drop(slot);
    shared.queue.lock().unwrap_or_else(|e| e.into_inner()).slots -= 1;
    shared.cv.notify_all();
}

/// Cgroup v1 only: moves one thread (not its whole process) into the slot's cgroups, or back
/// to the process's own cgroups (the parents of the sandbox's base cgroups).
fn v1_move_thread(cg: &cgroup::Slot, tid: libc::pid_t, back: bool) -> std::io::Result<()> {
    for dir in cg.paths() {
        let target = if back {
            dir.parent().and_then(|p| p.parent()).unwrap_or(dir)
        } else {
            dir.as_path()
        };
        std::fs::write(target.join("tasks"), tid.to_string())?;
    }
    Ok(())
}

fn init_slot(shared: &Shared, index: usize) -> Result<Slot> {
    // The slot thread handles no signals; children inherit the full mask and reset it.
    // SAFETY: sigfillset/pthread_sigmask on a local, valid sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    // A private mount namespace for this thread alone.
    crate::mounts::private_mount_namespace("slot's")?;
    if !shared.config.network {
        crate::net::unshare_thread_netns()
            .map_err(|e| Error::setup_io("creating the slot's network namespace", e))?;
    }
    let manager = shared.cgroups.lock().unwrap_or_else(|e| e.into_inner());
    if manager.is_none() && shared.cgroup_version.is_some() {
        return Err(Error::Closed);
    }
    let cgroup = match manager.as_ref() {
        Some(m) => {
            let s = m
                .create_slot(index)
                .map_err(|e| Error::setup(format!("creating the slot cgroup: {e}")))?;
            Some((s, m.version() == cgroup::Version::V1))
        }
        None => None,
    };
    drop(manager);
    // The box sees its own cgroup (read-only) under /sys/fs/cgroup. On v1 the template binds
    // the slot's directories there; on v2 every box mounts a cgroup2 view of its own instead
    // (rooted at its cgroup namespace: the slot's cgroup, or a cold run's own, see
    // `run::run_cgroup`), so the template leaves the directory empty.
    let view = match &cgroup {
        Some((s, true)) => CgroupView::new(s.paths()),
        _ => CgroupView::default(),
    };
    let template = Template::build(&shared.layout, &view)?;
    let paths = ChildPaths::new(&template.mountpoint);
    let stack =
        ChildStack::new(256 << 10).map_err(|e| Error::setup_io("allocating the child stack", e))?;
    // Two host ids per slot: the box user, and the slot's warm interpreter; the block is
    // claimed host-wide so that no other sandbox (of this or another process) uses it.
    let claim = shared
        .ids
        .claim("slot", shared.ids.slot_blocks)
        .map_err(|e| Error::setup_io("claiming host ids for the slot", e))?;
    let host_id = claim
        .index
        .checked_mul(2)
        .and_then(|i| shared.ids.base.checked_add(i))
        .filter(|i| i.checked_add(1).is_some())
        .ok_or_else(|| Error::invalid("host_id_base", "too large"))?;
    let stack2 =
        ChildStack::new(128 << 10).map_err(|e| Error::setup_io("allocating the child stack", e))?;
    // Last, once nothing else can fail: a thread left in a slot cgroup would keep it from
    // being removed when the half-made slot is dropped.
    let cgroup = match cgroup {
        Some((s, true)) => {
            // v1 lets one thread join a cgroup: boxes cloned from this thread start inside
            // it, with no per-run migration.
            let tid = crate::sys::gettid();
            if let Err(e) = v1_move_thread(&s, tid, false) {
                let _ = v1_move_thread(&s, tid, true);
                return Err(Error::setup_io("joining the slot cgroup", e));
            }
            Some(s)
        }
        Some((s, false)) => Some(s),
        None => None,
    };
    Ok(Slot {
        paths,
        stack,
        stack2,
        init_path: CString::new(crate::init::PATH).expect("no NUL"),
        cgroup,
        host_id,
        zygote_host_id: host_id + 1,
        zygote: None,
        between: Default::default(),
        _ids: claim,
        _template: template,
    })
}
