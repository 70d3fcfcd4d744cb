//! The launch phase ([`launch`]): the box, up to the start of the program. A cold run is a
//! clone of the slot thread ([`clone_box`], also how a slot starts its warm interpreter), a
//! warm one a fork of the slot's warm interpreter (`crate::warm::launch`); what comes back
//! is a [`Live`] box, or the caller's own mistake (no such program or directory) as a verdict.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::channels::{Channels, RunIo};
use super::error::Cause;
use super::fds::{kill, pipe};
use super::place::Placement;
use super::status::{read_status, receive_listener};
use super::verdict::cannot_execute;
use crate::cgroup;
use crate::mounts::{RunFs, BOX_ID};
use crate::sandbox::{Prepared, Shared, Slot};
use crate::spawn::{self, ChildPlan, Step};
use crate::supervise;
use crate::verdict::ExecResult;
use crate::warm;

/// What the launch phase gives.
pub(super) enum Launched {
    /// The program runs: its box, and the read ends of its stdout and stderr.
    Running(Running, Output),
    /// The program could not be executed: the verdict says why.
    CannotExecute(ExecResult),
}

/// A running box, and what the run holds until it is collected.
pub(super) struct Running {
    pub live: Live,
    /// The run's tmpfs (its `/work`, `/tmp` and `/dev/shm`).
    pub runfs: RunFs,
    /// The set-up status pipe's read end; the box's init writes its exit record there.
    pub status_r: OwnedFd,
    /// Our end of the socket the seccomp listener came through.
    pub sock_parent: OwnedFd,
}

/// The read ends of the program's stdout and stderr.
pub(super) struct Output {
    pub out_r: OwnedFd,
    pub err_r: OwnedFd,
}

/// The launch phase: starts the box of `run` (warm or cold) in the cgroup `placed` chose,
/// with the channels of `io`, and waits until the program starts. A warm interpreter that
/// failed to launch the run is discarded (the next warm run starts another).
pub(super) fn launch(
    shared: &Shared,
    slot: &mut Slot,
    run: &Prepared,
    io: RunIo,
    placed: &Placement,
) -> Result<Launched, Cause> {
    let RunIo {
        channels:
            Channels {
                runfs,
                out_r,
                out_w,
                err_r,
                err_w,
                status_r,
                status_w,
                sock_parent,
                sock_child,
                ..
            },
        stdin,
    } = io;
    let child_fds = ChildFds {
        run_mount: runfs.mount.as_fd(),
        stdin: stdin.as_fd(),
        stdout: out_w.as_fd(),
        stderr: err_w.as_fd(),
        listener_sock: sock_child.as_fd(),
    };
    // The status pipe's write end is handed over: the launch closes our copy, so that end of
    // file on it means "exec happened".
    let launched = if run.warm {
        warm::launch(
            shared,
            slot,
            run,
            &child_fds,
            (status_r.as_fd(), status_w),
            sock_parent.as_fd(),
        )
    } else {
        launch_cold(
            shared,
            slot,
            placed.own_cg.as_ref(),
            run,
            &child_fds,
            (status_r.as_fd(), status_w),
            sock_parent.as_fd(),
        )
    };
    drop((out_w, err_w, sock_child, stdin));
    match launched {
        Err(e) => {
            if run.warm {
                warm::discard(slot);
            }
            Err(e)
        }
        Ok(Launch::ExecFailed(step, errno)) => {
            Ok(Launched::CannotExecute(cannot_execute(run, step, errno)))
        }
        Ok(Launch::Live(live)) => Ok(Launched::Running(
            Running {
                live,
                runfs,
                status_r,
                sock_parent,
            },
            Output { out_r, err_r },
        )),
    }
}

/// How the box is reaped once its pidfd says it exited.
pub(crate) enum Reaper {
    /// Our own clone child.
    Wait4(libc::pid_t),
    /// A child of the slot's warm interpreter, which reports the status.
    WarmInterpreter,
}

/// A box that has reached `execve` (or the start of the user's code, on the warm path).
pub(crate) struct Live {
    /// The process whose exit ends the run (the box's init, or a warm run's program).
    pub pidfd: OwnedFd,
    /// The box's pid 1 when that is another process (a warm run's idle init).
    pub kill: Option<OwnedFd>,
    pub reaper: Reaper,
    pub listener: OwnedFd,
    /// The box's mount namespace (cold runs, where the kernel can tell it): held until the
    /// verdict is delivered, so that its teardown is not on the caller's critical path.
    pub mnt_ns: Option<OwnedFd>,
}

pub(crate) enum Launch {
    Live(Live),
    /// The program could not be executed (no such file, not executable...).
    ExecFailed(Step, i32),
}

/// The fds a child needs (it duplicates them; the parent closes its copies after launch).
pub(crate) struct ChildFds<'a> {
    pub run_mount: BorrowedFd<'a>,
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    pub listener_sock: BorrowedFd<'a>,
}

/// What `clone_box` should make.
pub(crate) struct BoxSpec<'a> {
    pub argv: &'a [std::ffi::CString],
    pub exec_paths: &'a [std::ffi::CString],
    pub env: &'a [std::ffi::CString],
    pub cwd: &'a std::ffi::CString,
    pub rlimits: &'a [(u32, libc::rlimit64)],
    /// `uid_map`/`gid_map` contents.
    pub id_map: String,
    /// For the warm interpreter: its control socket (becomes fd 3); it keeps root in the box.
    pub warm_control: Option<BorrowedFd<'a>>,
    /// For a session step: the overlay to attach at `/work`.
    pub work_mount: Option<BorrowedFd<'a>>,
    /// Host uid that owns the box's user namespace: the kernel charges the box's per-user
    /// counts (inotify instances, user namespaces, ...) to it, so it must be the box's own
    /// unprivileged uid, never root (whose limits the host itself lives on).
    pub owner: u32,
    /// The cgroup the box joins: the slot's, or a cold run's own (see
    /// [`run_cgroup`](super::place::run_cgroup)). On v2 the box shows it at `/sys/fs/cgroup`
    /// (a cgroup2 mount of its own).
    pub cgroup: Option<&'a cgroup::Slot>,
}

/// A box [`clone_box`] made: its `(pid, pidfd)` once it has exec'd, or the step (`Exec` or
/// `Chdir`) and errno of a failure that is the caller's.
pub(crate) type Cloned = Result<(libc::pid_t, OwnedFd), (Step, i32)>;

/// Clones a new box in the slot and waits until it has exec'd. Returns `(pid, pidfd)` or
/// the step (`Exec` or `Chdir`) and errno of a failure that is the caller's; `Err` for
/// set-up failures (the child is killed and reaped).
pub(crate) fn clone_box(
    shared: &Shared,
    slot: &Slot,
    spec: &BoxSpec<'_>,
    fds: &ChildFds<'_>,
    (status_r, status_w): (BorrowedFd<'_>, OwnedFd),
) -> Result<Cloned, Cause> {
    let (sync_r, sync_w) = pipe().map_err(Cause::io("pipe"))?;
    // The warm interpreter's control socket becomes fd 3: the status pipe must not be there.
    let status_w = if spec.warm_control.is_some() && status_w.as_raw_fd() <= 3 {
        // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd we own.
        let fd = unsafe { libc::fcntl(status_w.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if fd < 0 {
            return Err(Cause::io("fcntl")(std::io::Error::last_os_error()));
        }
        // SAFETY: fresh fd.
        unsafe { OwnedFd::from_raw_fd(fd) }
    } else {
        status_w
    };
    let argv_ptrs = spawn::ptr_array(spec.argv);
    let env_ptrs = spawn::ptr_array(spec.env);
    let plan = ChildPlan {
        paths: &slot.paths,
        run_mount_fd: fds.run_mount.as_raw_fd(),
        sync_read: sync_r.as_raw_fd(),
        status_write: status_w.as_raw_fd(),
        listener_sock: fds.listener_sock.as_raw_fd(),
        stdin_fd: fds.stdin.as_raw_fd(),
        stdout_fd: fds.stdout.as_raw_fd(),
        stderr_fd: fds.stderr.as_raw_fd(),
        rlimits: spec.rlimits,
        cap_last: shared.cap_last,
        box_id: BOX_ID,
        hostname: b"sandbox",
        cwd: spec.cwd,
        exec_paths: spec.exec_paths,
        argv: &argv_ptrs,
        envp: &env_ptrs,
        filter: &shared.filter,
        warm_control: spec.warm_control.map(|f| f.as_raw_fd()).unwrap_or(-1),
        work_mount_fd: spec.work_mount.map(|f| f.as_raw_fd()).unwrap_or(-1),
        stack2_top: slot.stack2.top(),
        init_path: &slot.init_path,
        host_dumpable: shared.host_dumpable,
        mount_cgroup2: spec.cgroup.is_some() && shared.cgroup_version == Some(cgroup::Version::V2),
    };
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    // SAFETY: plan and everything it points to live until this function returns, by which
    // time the child has exec'd or been reaped; the stack belongs to this slot, which launches
    // one child at a time; the slot thread blocks every signal.
    // The new user namespace is owned by the creator's effective uid: switch this thread
    // (raw setresuid: this thread only, not the whole process as glibc's wrapper would) to
    // the box's host uid around the clone. The saved uid stays 0, so switching back needs no
    // capability, and the effective capabilities come back with it.
    // SAFETY: setresuid with -1 for the ids left unchanged.
    if unsafe { libc::syscall(libc::SYS_setresuid, -1i32, spec.owner, -1i32) } < 0 {
        return Err(Cause::io("switching to the box's host uid")(
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: see above.
    let cloned = unsafe { spawn::clone_child(&plan, &slot.stack, flags) };
    // SAFETY: back to effective uid 0 (the saved uid).
    if unsafe { libc::syscall(libc::SYS_setresuid, -1i32, 0, -1i32) } < 0 {
        // The slot thread can no longer manage boxes; this must not happen.
        panic!(
            "cannot switch the slot thread back to root: {}",
            std::io::Error::last_os_error()
        );
    }
    if shared.host_dumpable {
        // Changing the effective uid cleared the process's (memory-wide) dumpable flag.
        // SAFETY: prctl with flags only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    }
    let (pid, pidfd) = cloned.map_err(Cause::io("clone"))?;
    // SAFETY: fresh pidfd from clone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(sync_r);
    drop(status_w);
    let abort = |why: Cause| {
        kill(pidfd.as_fd());
        supervise::reap(pid);
        why
    };
    // Identity maps: box users are unprivileged host ids, never host root.
    if let Err(e) = std::fs::write(format!("/proc/{pid}/uid_map"), &spec.id_map)
        .and_then(|_| std::fs::write(format!("/proc/{pid}/gid_map"), &spec.id_map))
    {
        return Err(abort(Cause::io("writing the id maps")(e)));
    }
    if let Some(cg) = spec.cgroup {
        if shared.cgroup_version == Some(cgroup::Version::V2) {
            if let Err(e) = cg.attach(pid) {
                return Err(abort(Cause::cgroup("attaching to the slot cgroup")(e)));
            }
        }
    }
    // SAFETY: writing one byte from a valid buffer to our pipe.
    if unsafe { libc::write(sync_w.as_raw_fd(), b"g".as_ptr().cast(), 1) } != 1 {
        return Err(abort(Cause::io("releasing the child")(
            std::io::Error::last_os_error(),
        )));
    }
    match read_status(status_r, Duration::from_secs(30)) {
        Err(e) => Err(abort(e)),
        Ok(None) => Ok(Ok((pid, pidfd))),
        Ok(Some((step @ (Step::Exec | Step::Chdir), errno))) => {
            supervise::reap(pid);
            Ok(Err((step, errno)))
        }
        Ok(Some((step, errno))) => {
            supervise::reap(pid);
            Err(format!(
                "box set-up failed at {}: {}",
                step.describe(),
                std::io::Error::from_raw_os_error(errno)
            )
            .into())
        }
    }
}

fn launch_cold(
    shared: &Shared,
    slot: &Slot,
    own_cg: Option<&cgroup::Slot>,
    run: &Prepared,
    fds: &ChildFds<'_>,
    status: (BorrowedFd<'_>, OwnedFd),
    sock_parent: BorrowedFd<'_>,
) -> Result<Launch, Cause> {
    // A run in a cgroup of its own (see `run_cgroup`) joins it; any other the slot's.
    let cg = own_cg.or(slot.cgroup.as_ref());
    let degraded = cg.is_none();
    let rlimits = crate::rlimit::for_limits(&run.limits, degraded);
    let spec = BoxSpec {
        argv: &run.argv,
        exec_paths: &run.exec_paths,
        env: &run.env,
        cwd: &run.cwd,
        rlimits: &rlimits,
        // The box's init is root of the user namespace on the slot's second host id; the
        // program is the box user on the first (or on the session's).
        id_map: format!(
            "0 {} 1\n{BOX_ID} {} 1\n",
            slot.warm_host_id,
            run.session
                .as_ref()
                .map(|(_, id)| *id)
                .unwrap_or(slot.host_id)
        ),
        warm_control: None,
        work_mount: run.session.as_ref().map(|(m, _)| m.as_fd()),
        owner: run
            .session
            .as_ref()
            .map(|(_, id)| *id)
            .unwrap_or(slot.host_id),
        cgroup: cg,
    };
    match clone_box(shared, slot, &spec, fds, status)? {
        Err((step, errno)) => Ok(Launch::ExecFailed(step, errno)),
        Ok((pid, pidfd)) => {
            let listener = receive_listener(sock_parent).inspect_err(|_| {
                kill(pidfd.as_fd());
                supervise::reap(pid);
            })?;
            let mnt_ns = mount_namespace(pidfd.as_fd());
            Ok(Launch::Live(Live {
                pidfd,
                kill: None,
                reaper: Reaper::Wait4(pid),
                listener,
                mnt_ns,
            }))
        }
    }
}

/// The mount namespace of a live process, from its pidfd (`PIDFD_GET_MNT_NAMESPACE`, Linux
/// 6.11+); `None` on older kernels, or if the process is gone already.
fn mount_namespace(pidfd: BorrowedFd<'_>) -> Option<OwnedFd> {
    // _IO(PIDFS_IOCTL_MAGIC = 0xFF, 3), from <linux/pidfd.h>.
    const PIDFD_GET_MNT_NAMESPACE: libc::c_ulong = 0xff03;
    // SAFETY: an ioctl without an argument on a valid fd; it returns a new fd or fails.
    let fd = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_MNT_NAMESPACE as _, 0) };
    // SAFETY: a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}
