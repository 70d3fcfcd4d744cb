//! The sandbox: a set of slots, each a thread that owns one box's worth of isolation.
//!
//! A slot is created lazily, at most `max_concurrency` of them, and lives until the sandbox
//! closes. It owns everything that is slow to create and safe to reuse: a private mount
//! namespace holding the read-only root template, an empty network namespace, a cgroup (or one
//! per v1 controller), a host uid/gid of its own and the child stack. A run is handed to an
//! idle slot through a queue; the caller blocks (without the GIL, in the Python binding)
//! until the slot replies. One slot runs one box at a time, so no two live boxes ever share a
//! network namespace, a cgroup or a host identity.

use std::collections::VecDeque;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cgroup;
use crate::config::{self, RunRequest, SandboxConfig, WORK_DIR};
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::mounts::{ChildPaths, Layout, RunFs, Template, BOX_ID};
use crate::seccomp::{self, Filter, Policy};
use crate::spawn::{self, ChildPlan, ChildStack, Step};
use crate::supervise::{self, Capture, Kill};
use crate::verdict::{ExecResult, LimitKind, Status};

/// A run, validated and converted to what the child needs.
struct Prepared {
    argv: Vec<CString>,
    exec_paths: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    stdin: Vec<u8>,
    files: Vec<(Vec<String>, Vec<u8>)>,
    collect: Vec<(String, Vec<String>)>,
    limits: Limits,
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
    idle: usize,
    slots: usize,
    next_index: usize,
    closed: bool,
}

struct Shared {
    config: SandboxConfig,
    layout: Layout,
    filter: Filter,
    /// The cgroup manager; taken (and its base cgroups removed) by `close`.
    cgroups: Mutex<Option<cgroup::Manager>>,
    cgroup_version: Option<cgroup::Version>,
    queue: Mutex<Queue>,
    cv: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    cap_last: u32,
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
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::setup(
                "agentrl's sandbox needs root (it creates mount, pid and network namespaces, maps \
                 unprivileged host ids and manages cgroups); run as root or inside a container \
                 that grants CAP_SYS_ADMIN",
            ));
        }
        let layout = Layout::discover(&config)?;
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
                return Err(Error::setup(format!(
                    "{e}; memory and pids limits need cgroups (pass degraded=True to accept rlimit-only limits)"
                )))
            }
        };
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
                idle: 0,
                slots: 0,
                next_index: 0,
                closed: false,
            }),
            cv: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            cap_last,
        });
        start_slot(&shared)?;
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

    /// Runs one program in a fresh box and returns its verdict. Blocks the calling thread.
    pub fn run(&self, req: RunRequest) -> Result<ExecResult> {
        let prepared = prepare(&self.shared.config, req)?;
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
            let grow = q.idle < q.jobs.len() && q.slots < self.shared.config.max_concurrency;
            drop(q);
            self.shared.cv.notify_one();
            if grow {
                // A failure to add a slot is not fatal: the existing slots serve the job.
                let _ = start_slot(&self.shared);
            }
        }
        let mut slot = reply.slot.lock().unwrap_or_else(|e| e.into_inner());
        while slot.is_none() {
            slot = reply.cv.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
        Ok(slot.take().expect("checked above"))
    }

    /// Stops the slots after the queued runs finish, and removes the cgroups.
    pub fn close(&self) {
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
        // Every slot cgroup is gone; remove the sandbox's base cgroups.
        drop(
            self.shared
                .cgroups
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
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
        self.close();
    }
}

fn prepare(config: &SandboxConfig, req: RunRequest) -> Result<Prepared> {
    let limits = req.limits.unwrap_or_else(|| config.limits.clone());
    limits.validate()?;
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
    })
}

fn start_slot(shared: &Arc<Shared>) -> Result<()> {
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
    match rx.recv() {
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
struct Slot {
    paths: ChildPaths,
    stack: ChildStack,
    cgroup: Option<cgroup::Slot>,
    host_id: u32,
    _template: Template,
}

fn slot_main(shared: Arc<Shared>, index: usize, ready: std::sync::mpsc::Sender<Result<()>>) {
    let slot = match init_slot(&shared, index) {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            shared.queue.lock().unwrap_or_else(|e| e.into_inner()).slots -= 1;
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut slot = slot;
    loop {
        let job = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break Some(j);
                }
                if q.closed {
                    break None;
                }
                q.idle += 1;
                q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                q.idle -= 1;
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
        *job.reply.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        job.reply.cv.notify_one();
    }
    if let Some(cg) = &slot.cgroup {
        let _ = cg.kill_all();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
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
    // A private mount namespace for this thread alone (CLONE_FS first: a thread that shares
    // its fs_struct may not change mount namespace).
    // SAFETY: unshare affects only this thread's fs and mount namespace.
    if unsafe { libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS) } < 0 {
        return Err(Error::setup_io(
            "unsharing the slot's mount namespace",
            std::io::Error::last_os_error(),
        ));
    }
    let root = c"/";
    // SAFETY: mount with NULL source/type/data and a valid path.
    if unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    } < 0
    {
        return Err(Error::setup_io(
            "making the slot's mounts private",
            std::io::Error::last_os_error(),
        ));
    }
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
            if m.version() == cgroup::Version::V1 {
                // v1 lets one thread join a cgroup: boxes cloned from this thread start inside
                // it, with no per-run migration.
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                v1_move_thread(&s, tid, false)
                    .map_err(|e| Error::setup_io("joining the slot cgroup", e))?;
            }
            Some(s)
        }
        None => None,
    };
    drop(manager);
    let template = Template::build(&shared.layout)?;
    let paths = ChildPaths::new(&template.mountpoint);
    let stack =
        ChildStack::new(256 << 10).map_err(|e| Error::setup_io("allocating the child stack", e))?;
    let host_id = shared
        .config
        .host_id_base
        .checked_add(index as u32)
        .ok_or_else(|| Error::invalid("host_id_base", "too large"))?;
    Ok(Slot {
        paths,
        stack,
        cgroup,
        host_id,
        _template: template,
    })
}

/// Creates a pipe whose two ends are close-on-exec and numbered 3 or higher.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a valid fd.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

fn memfd_with(data: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: NUL-terminated name; the fd is ours.
    let fd = unsafe { libc::memfd_create(c"stdin".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut off = 0;
    while off < data.len() {
        // SAFETY: valid buffer.
        let n = unsafe {
            libc::write(
                fd.as_raw_fd(),
                data[off..].as_ptr().cast(),
                data.len() - off,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        off += n as usize;
    }
    // SAFETY: valid fd.
    unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_SET) };
    Ok(fd)
}

fn write_id_map(pid: libc::pid_t, file: &str, inside: u32, outside: u32) -> std::io::Result<()> {
    std::fs::write(
        format!("/proc/{pid}/{file}"),
        format!("{inside} {outside} 1\n"),
    )
}

fn thread_cpu_ns() -> u64 {
    // SAFETY: timespec is plain old data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn run_in_slot(shared: &Shared, slot: &mut Slot, run: &Prepared) -> ExecResult {
    match run_inner(shared, slot, run) {
        Ok(r) => r,
        Err(e) => ExecResult::sandbox_error(e),
    }
}

fn run_inner(
    shared: &Shared,
    slot: &mut Slot,
    run: &Prepared,
) -> std::result::Result<ExecResult, String> {
    let l = &run.limits;
    let io = |what: &'static str| move |e: std::io::Error| format!("{what}: {e}");
    let host_id = slot.host_id;
    // Per-run file system, streams and channels.
    let runfs = RunFs::new(l.tmpfs_bytes, host_id, host_id, &run.files)
        .map_err(io("creating the run tmpfs"))?;
    let stdin = memfd_with(&run.stdin).map_err(io("preparing stdin"))?;
    let (out_r, out_w) = pipe().map_err(io("pipe"))?;
    let (err_r, err_w) = pipe().map_err(io("pipe"))?;
    let (status_r, status_w) = pipe().map_err(io("pipe"))?;
    let (sync_r, sync_w) = pipe().map_err(io("pipe"))?;
    let mut sp = [0; 2];
    // SAFETY: sp is a valid two-element array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sp.as_mut_ptr(),
        )
    } < 0
    {
        return Err(format!("socketpair: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fresh fds.
    let (sock_parent, sock_child) =
        unsafe { (OwnedFd::from_raw_fd(sp[0]), OwnedFd::from_raw_fd(sp[1])) };
    set_nonblocking(out_r.as_raw_fd());
    set_nonblocking(err_r.as_raw_fd());

    let degraded = slot.cgroup.is_none();
    if let Some(cg) = &mut slot.cgroup {
        // +1 pid: on cgroup v1 the slot thread itself is a member.
        let extra = if shared.cgroup_version == Some(cgroup::Version::V1) {
            1
        } else {
            0
        };
        cg.set_limits(Some(l.memory_bytes), Some(l.max_pids + extra))
            .map_err(|e| format!("cgroup limits: {e}"))?;
        cg.prepare_run().map_err(|e| format!("cgroup reset: {e}"))?;
    }
    let rlimits = crate::rlimit::for_limits(l, degraded);
    let argv_ptrs = spawn::ptr_array(&run.argv);
    let env_ptrs = spawn::ptr_array(&run.env);
    let plan = ChildPlan {
        paths: &slot.paths,
        run_mount_fd: runfs.mount.as_raw_fd(),
        sync_read: sync_r.as_raw_fd(),
        status_write: status_w.as_raw_fd(),
        listener_sock: sock_child.as_raw_fd(),
        stdin_fd: stdin.as_raw_fd(),
        stdout_fd: out_w.as_raw_fd(),
        stderr_fd: err_w.as_raw_fd(),
        rlimits: &rlimits,
        cap_last: shared.cap_last,
        box_id: BOX_ID,
        hostname: b"sandbox",
        cwd: &run.cwd,
        exec_paths: &run.exec_paths,
        argv: &argv_ptrs,
        envp: &env_ptrs,
        filter: &shared.filter,
    };
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    let thread_cpu0 = thread_cpu_ns();
    // SAFETY: plan and everything it points to live until after the child has exec'd or been
    // reaped below; the stack belongs to this slot, which runs one child at a time; this
    // thread blocks every signal.
    let (pid, pidfd) =
        unsafe { spawn::clone_child(&plan, &slot.stack, flags) }.map_err(io("clone"))?;
    // SAFETY: fresh pidfd from clone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // The child holds its own copies of its ends.
    drop(out_w);
    drop(err_w);
    drop(sync_r);
    drop(sock_child);
    let abort = |why: String| {
        // SAFETY: signalling and reaping our own child through its pidfd / pid.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<u8>(),
                0,
            );
            let mut st = 0;
            libc::waitpid(pid, &mut st, libc::__WALL);
        }
        why
    };
    // Identity maps: the box user is an unprivileged host id, never host root.
    if let Err(e) = write_id_map(pid, "uid_map", BOX_ID, host_id)
        .and_then(|_| write_id_map(pid, "gid_map", BOX_ID, host_id))
    {
        return Err(abort(format!("writing the id maps: {e}")));
    }
    if let Some(cg) = &slot.cgroup {
        if shared.cgroup_version == Some(cgroup::Version::V2) {
            if let Err(e) = cg.attach(pid) {
                return Err(abort(format!("attaching to the slot cgroup: {e}")));
            }
        }
    }
    // SAFETY: writing one byte from a valid buffer to our pipe.
    if unsafe { libc::write(sync_w.as_raw_fd(), b"g".as_ptr().cast(), 1) } != 1 {
        return Err(abort(format!(
            "releasing the child: {}",
            std::io::Error::last_os_error()
        )));
    }
    drop(status_w);
    // Wait for exec (end of file) or a failure record.
    let mut rec = [0u8; 8];
    let mut got = 0;
    let setup_deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut pfd = libc::pollfd {
            fd: status_r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
        if n == 0 {
            if Instant::now() > setup_deadline {
                return Err(abort(
                    "the child did not finish its set-up within 30 s".into(),
                ));
            }
            continue;
        }
        // SAFETY: reading into the remaining part of rec.
        let r = unsafe {
            libc::read(
                status_r.as_raw_fd(),
                rec[got..].as_mut_ptr().cast(),
                8 - got,
            )
        };
        if r < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(abort(format!(
                "reading the child's status: {}",
                std::io::Error::last_os_error()
            )));
        }
        if r == 0 {
            break;
        }
        got += r as usize;
        if got == 8 {
            break;
        }
    }
    let started = Instant::now();
    if got == 8 {
        let step = u32::from_ne_bytes([rec[0], rec[1], rec[2], rec[3]]);
        let errno = i32::from_ne_bytes([rec[4], rec[5], rec[6], rec[7]]);
        let mut st = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        let err = std::io::Error::from_raw_os_error(errno);
        return match Step::from_u32(step) {
            Some(Step::Exec) => {
                let mut r = ExecResult::sandbox_error("");
                r.status = Status::RuntimeError;
                r.error = None;
                r.exit_code = Some(127);
                r.stderr = format!(
                    "agentrl: cannot execute {}: {err}\n",
                    run.argv[0].to_string_lossy()
                )
                .into_bytes();
                Ok(r)
            }
            Some(s) => Err(format!("box set-up failed at {}: {err}", s.describe())),
            None => Err(format!(
                "box set-up failed at an unknown step {step}: {err}"
            )),
        };
    }
    drop(sync_w);
    let listener = match seccomp::recv_fd(sock_parent.as_fd()) {
        Ok(fd) => fd,
        Err(e) => return Err(abort(format!("receiving the seccomp listener: {e}"))),
    };
    set_nonblocking(listener.as_raw_fd());

    let mut out = Capture::new(out_r, l.max_output_bytes);
    let mut err = Capture::new(err_r, l.max_output_bytes);
    let cg = slot.cgroup.as_ref();
    let cpu_time = || -> Option<u64> {
        let ns = cg?.cpu_time_ns().ok()?;
        Some(ns.saturating_sub(thread_cpu_ns().saturating_sub(thread_cpu0)))
    };
    let deadline = started + Duration::from_secs_f64(l.wall_time_s);
    let w = supervise::watch(
        supervise::Params {
            pid,
            pidfd: pidfd.as_fd(),
            listener: Some(listener.as_fd()),
            deadline,
            cpu_limit_ns: (l.cpu_time_s * 1e9) as u64,
            cpu_time: &cpu_time,
        },
        &mut out,
        &mut err,
    );
    let wall = started.elapsed().as_secs_f64();
    // `plan` (and the buffers it points into) lived until here: the child has exec'd or died.

    let usage = match slot.cgroup.as_ref() {
        Some(cg) => Some(
            cg.usage()
                .map_err(|e| format!("reading the slot cgroup: {e}"))?,
        ),
        None => None,
    };
    let rusage_cpu = tv(&w.rusage.ru_utime) + tv(&w.rusage.ru_stime);
    let cpu_time_s = match &usage {
        Some(u) => {
            let own = thread_cpu_ns().saturating_sub(thread_cpu0);
            (u.cpu_time_ns.saturating_sub(own) as f64 / 1e9).max(rusage_cpu)
        }
        None => rusage_cpu,
    };
    let peak = usage
        .as_ref()
        .and_then(|u| u.peak_memory_bytes)
        .or(Some(w.rusage.ru_maxrss as u64 * 1024));
    let st = w.wait_status;
    let (exit_code, signal) = if libc::WIFEXITED(st) {
        (Some(libc::WEXITSTATUS(st)), None)
    } else {
        (None, Some(libc::WTERMSIG(st)))
    };
    let oom = usage.as_ref().map(|u| u.oom_killed).unwrap_or(false);
    let pids_hit = usage.as_ref().map(|u| u.pids_limit_hit).unwrap_or(false);
    let truncated = out.truncated() || err.truncated();
    let (status, limit) = if oom {
        (Status::MemoryLimit, Some(LimitKind::Memory))
    } else if w.killed == Some(Kill::WallTime) {
        (Status::Timeout, Some(LimitKind::WallTime))
    } else if w.killed == Some(Kill::CpuTime)
        || signal == Some(libc::SIGXCPU)
        || (signal == Some(libc::SIGKILL) && cpu_time_s >= l.cpu_time_s)
    {
        (Status::Timeout, Some(LimitKind::CpuTime))
    } else if truncated {
        (Status::OutputLimit, Some(LimitKind::Output))
    } else if let Some(sig) = signal {
        (
            Status::Signaled,
            if sig == libc::SIGXFSZ {
                Some(LimitKind::FileSize)
            } else {
                None
            },
        )
    } else if exit_code != Some(0) {
        (
            Status::RuntimeError,
            if pids_hit {
                Some(LimitKind::Pids)
            } else {
                None
            },
        )
    } else {
        (
            Status::Ok,
            if pids_hit {
                Some(LimitKind::Pids)
            } else {
                None
            },
        )
    };
    let mut files = Vec::new();
    let mut truncated_files = Vec::new();
    for (name, parts) in &run.collect {
        if let Some((data, cut)) = runfs.collect(parts, l.max_file_bytes) {
            if cut {
                truncated_files.push(name.clone());
            }
            files.push((name.clone(), data));
        }
    }
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
        limit,
        denied_syscalls: w.denied,
        files,
        truncated_files,
        error: None,
    })
}

fn tv(t: &libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}
