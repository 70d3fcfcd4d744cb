//! Persistent sessions for multi-turn agents.
//!
//! A session's work dir outlives its steps (no process does: each step is an ordinary box).
//! It is an **overlay**: read-only lower layers (the initial files, then every snapshot) under
//! a writable upper layer, each layer its own tmpfs. So
//! * `reset()` swaps in a fresh, empty upper layer: O(1), whatever the size of the files;
//! * `snapshot()` freezes the current upper layer as a new lower layer and starts an empty
//!   one: O(1); a snapshot is the list of layers it sees, so branches share their past;
//! * `restore(snap)` points the session at that list again, with an empty upper layer.
//!
//! The layers live in the private mount namespace of one manager thread per sandbox (nothing
//! of them is visible on the host or to another session). For each step the manager builds a
//! fresh overlay mount (`fsopen("overlay")`, detached) that the step's box attaches at
//! `/work`; the parent keeps reading collected files through the same mount fd. Files belong
//! to a host uid of the session's own, which the step's box user is mapped onto.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::mounts::{self, mkdirat, new_tmpfs};

type Job = Box<dyn FnOnce(&mut State) + Send>;

/// The manager thread's state.
pub(crate) struct State {
    /// Where session layers are attached, in the manager's private mount namespace.
    base: PathBuf,
    next: u64,
}

/// Runs session operations on a thread with its own mount namespace.
pub(crate) struct Manager {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The process that started the thread: a child made with `fork()` has no such thread,
    /// and its session handles are refused rather than left waiting for an answer.
    owner_pid: u32,
}

impl Manager {
    pub(crate) fn new() -> Result<Manager> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("agentrl-sessions".into())
            .spawn(move || {
                let mut state = match init() {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut state);
                }
            })
            .map_err(|e| Error::setup_io("starting the session thread", e))?;
        ready_rx
            .recv()
            .map_err(|_| Error::setup("the session thread died"))??;
        Ok(Manager {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            owner_pid: std::process::id(),
        })
    }

    /// Runs `f` on the manager thread and returns its result.
    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State) -> R + Send + 'static,
    ) -> Result<R> {
        if std::process::id() != self.owner_pid {
            return Err(Error::setup(format!(
                "this session belongs to process {}: a child made with fork() cannot use it",
                self.owner_pid
            )));
        }
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |s| {
            let _ = tx.send(f(s));
        });
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|t| t.send(job));
        match sent {
            Some(Ok(())) => rx
                .recv()
                .map_err(|_| Error::setup("the session thread died")),
            _ => Err(Error::Closed),
        }
    }

    pub(crate) fn close(&self) {
        if std::process::id() != self.owner_pid {
            return; // the thread is the parent's
        }
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn init() -> Result<State> {
    crate::mounts::private_mount_namespace("session thread's")?;
    // A private tmpfs for the mount points, over /tmp of this thread's namespace only.
    let base = PathBuf::from("/tmp");
    let fd = new_tmpfs(
        &[("size", "1m".into()), ("mode", "0700".into())],
        0x2 | 0x4 | 0x8,
    )
    .map_err(|e| Error::setup_io("creating the session tmpfs", e))?;
    move_mount(fd.as_fd(), &base).map_err(|e| Error::setup_io("attaching the session tmpfs", e))?;
    Ok(State { base, next: 0 })
}

fn cpath(p: &Path) -> CString {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in generated paths")
}

fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn move_mount(fd: std::os::fd::BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let (empty, t) = (c"", cpath(target));
    // SAFETY: valid fd and NUL-terminated strings.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            0x4u32,
        )
    })?;
    Ok(())
}

fn detach(target: &Path) {
    let t = cpath(target);
    // SAFETY: NUL-terminated path.
    unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
}

fn chown(dir: std::os::fd::BorrowedFd<'_>, name: &[u8], id: u32) -> io::Result<()> {
    let n = CString::new(name).expect("no NUL");
    // SAFETY: valid dir fd and name.
    if unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            n.as_ptr(),
            id,
            id,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One session's layers.
struct Layers {
    dir: PathBuf,
    /// Frozen lower layers this session currently sees, bottom first (paths of dirs).
    lowers: Vec<PathBuf>,
    /// Every frozen layer made so far (kept until close: snapshots may point at them).
    count: u64,
    upper: PathBuf,
    host_id: u32,
    disk_bytes: u64,
}

impl Layers {
    fn new_upper(&mut self) -> io::Result<()> {
        let m = new_tmpfs(
            &[
                ("size", self.disk_bytes.to_string()),
                ("mode", "0755".into()),
            ],
            0x2 | 0x4,
        )?;
        let root = mounts::open_dir_at(m.as_fd(), b".")?;
        for n in [&b"u"[..], b"w"] {
            mkdirat(root.as_fd(), n, 0o755)?;
        }
        chown(root.as_fd(), b"u", self.host_id)?;
        mkdirat_path(&self.upper)?;
        move_mount(m.as_fd(), &self.upper)
    }
}

fn mkdirat_path(p: &Path) -> io::Result<()> {
    match std::fs::create_dir(p) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// A snapshot: the layers it sees.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) session: u64,
    pub(crate) lowers: Vec<PathBuf>,
}

/// A persistent work dir. Cheap to clone (the handle is shared).
#[derive(Clone)]
pub struct Session {
    pub(crate) id: u64,
    pub(crate) host_id: u32,
    manager: Arc<Manager>,
    layers: Arc<Mutex<Option<Layers>>>,
    /// The host id stays claimed while any handle of the session lives.
    _ids: Arc<crate::ids::Claim>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("host_id", &self.host_id)
            .finish()
    }
}

/// Lower layers an overlay accepts at most (the kernel's limit is 500).
const MAX_LAYERS: usize = 400;

impl Session {
    pub(crate) fn create(
        manager: Arc<Manager>,
        host_id: u32,
        files: Vec<(Vec<String>, Vec<u8>)>,
        disk_bytes: u64,
        claim: crate::ids::Claim,
    ) -> Result<Session> {
        let layers = manager.call(move |st| -> io::Result<(u64, Layers)> {
            let id = st.next;
            st.next += 1;
            let dir = st.base.join(format!("s{id}"));
            std::fs::create_dir(&dir)?;
            // Layer 0: the initial files, frozen.
            let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
            let size = (total * 2 + (1 << 20)).max(disk_bytes);
            let m = new_tmpfs(
                &[("size", size.to_string()), ("mode", "0755".into())],
                0x2 | 0x4,
            )?;
            let root = mounts::open_dir_at(m.as_fd(), b".")?;
            chown(root.as_fd(), b".", host_id)?;
            for (parts, data) in &files {
                let mut path = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        path.push(b'/');
                    }
                    path.extend_from_slice(p.as_bytes());
                    if i + 1 < parts.len() {
                        mkdirat(root.as_fd(), &path, 0o755)?;
                        chown(root.as_fd(), &path, host_id)?;
                    }
                }
                let f = mounts::write_file_at(root.as_fd(), &path, data, 0o644)?;
                // SAFETY: valid fd.
                if unsafe { libc::fchown(f.as_raw_fd(), host_id, host_id) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let l0 = dir.join("l0");
            std::fs::create_dir(&l0)?;
            move_mount(m.as_fd(), &l0)?;
            let mut layers = Layers {
                upper: dir.join("up"),
                dir,
                lowers: vec![l0],
                count: 1,
                host_id,
                disk_bytes,
            };
            layers.new_upper()?;
            Ok((id, layers))
        })?;
        let (id, layers) = layers.map_err(|e| Error::setup_io("creating the session", e))?;
        Ok(Session {
            id,
            host_id,
            manager,
            layers: Arc::new(Mutex::new(Some(layers))),
            _ids: Arc::new(claim),
        })
    }

    /// Runs `f` on the manager thread with this session's layers.
    fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Layers) -> io::Result<R> + Send + 'static,
    ) -> Result<R> {
        let layers = self.layers.clone();
        let r = self.manager.call(move |_| {
            let mut g = layers.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_mut() {
                Some(l) => f(l).map_err(|e| Error::setup_io("session", e)),
                None => Err(Error::Closed),
            }
        })?;
        r
    }

    /// A fresh overlay mount of the current state, to attach at `/work` of one step.
    pub(crate) fn step_mount(&self) -> Result<OwnedFd> {
        self.with(|l| {
            let fs = new_fs_context(b"overlay")?;
            let lower = l
                .lowers
                .iter()
                .rev()
                .map(|p| p.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(":");
            set_string(&fs, "lowerdir", &lower)?;
            set_string(&fs, "upperdir", &l.upper.join("u").to_string_lossy())?;
            set_string(&fs, "workdir", &l.upper.join("w").to_string_lossy())?;
            create_and_mount(&fs, 0x2 | 0x4)
        })
    }

    /// Drops every change since the last snapshot, reset or restore.
    pub fn reset(&self) -> Result<()> {
        self.with(|l| {
            detach(&l.upper);
            l.new_upper()
        })
    }

    /// Freezes the current state; `restore` can return to it later.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let id = self.id;
        self.with(move |l| {
            if l.lowers.len() >= MAX_LAYERS {
                return Err(io::Error::other(format!(
                    "a session holds at most {MAX_LAYERS} snapshots"
                )));
            }
            let frozen = l.dir.join(format!("l{}", l.count));
            l.count += 1;
            std::fs::create_dir(&frozen)?;
            let (from, to) = (cpath(&l.upper), cpath(&frozen));
            // SAFETY: valid paths; MS_MOVE moves the upper layer's mount to its new place.
            if unsafe {
                libc::mount(
                    from.as_ptr(),
                    to.as_ptr(),
                    std::ptr::null(),
                    libc::MS_MOVE,
                    std::ptr::null(),
                )
            } < 0
            {
                return Err(io::Error::last_os_error());
            }
            l.lowers.push(frozen.join("u"));
            l.new_upper()?;
            Ok(Snapshot {
                session: id,
                lowers: l.lowers.clone(),
            })
        })
    }

    /// Returns to a snapshot of this session (later snapshots stay valid: branches).
    pub fn restore(&self, snap: &Snapshot) -> Result<()> {
        if snap.session != self.id {
            return Err(Error::invalid("snapshot", "it belongs to another session"));
        }
        let lowers = snap.lowers.clone();
        self.with(move |l| {
            l.lowers = lowers;
            detach(&l.upper);
            l.new_upper()
        })
    }

    /// Frees every layer. Idempotent.
    pub fn close(&self) {
        let layers = self.layers.clone();
        let _ = self.manager.call(move |_| {
            if let Some(l) = layers.lock().unwrap_or_else(|e| e.into_inner()).take() {
                detach(&l.upper);
                for i in 0..l.count {
                    detach(&l.dir.join(format!("l{i}")));
                }
                let _ = std::fs::remove_dir_all(&l.dir);
            }
        });
    }
}

fn new_fs_context(name: &[u8]) -> io::Result<OwnedFd> {
    let n = CString::new(name).expect("no NUL");
    // SAFETY: fsopen with a NUL-terminated name.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_fsopen, n.as_ptr(), libc::FSOPEN_CLOEXEC) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn set_string(fs: &OwnedFd, key: &str, value: &str) -> io::Result<()> {
    let (k, v) = (
        CString::new(key).expect("no NUL"),
        CString::new(value).map_err(io::Error::other)?,
    );
    // SAFETY: valid fs-context fd and strings.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            1u32,
            k.as_ptr(),
            v.as_ptr(),
            0,
        )
    })?;
    Ok(())
}

fn create_and_mount(fs: &OwnedFd, attrs: u64) -> io::Result<OwnedFd> {
    // SAFETY: FSCONFIG_CMD_CREATE on a valid context, then fsmount.
    unsafe {
        cvt(libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            6u32,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
        ))?;
        let m = cvt(libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attrs,
        ))?;
        Ok(OwnedFd::from_raw_fd(m as RawFd))
    }
}
