//! Creating the box: one flat, ordered containment pipeline.
//!
//! # Who forks
//! The host process is multi-threaded (Python, torch, the sandbox's own slot threads), so the
//! box is created the way `posix_spawn` creates a process: `clone(CLONE_VM | CLONE_NEW*)`
//! onto a stack allocated in advance. The child shares the parent's memory until `execve`, so
//! it costs the same whatever the size of the host process, and it must do only
//! async-signal-safe work: it reads a [`ChildPlan`] that the parent built completely before
//! the clone (every path, argument, environment entry, rlimit and the compiled seccomp
//! filter), issues raw system calls through [`crate::sys`] (never libc wrappers, which would
//! write the parent thread's `errno`), and reports a failure as a fixed 8-byte record on a
//! close-on-exec pipe. It never allocates, never takes a lock, never panics.
//!
//! # The pipeline (child side, in order)
//! 1. mark every inherited fd close-on-exec (`close_range`), wait for the parent to write
//!    the uid/gid maps (and, on cgroup v2, to attach it to the slot cgroup);
//! 2. mount: per-run tmpfs at `/.run` (closed to the box), binds of its directories over
//!    `/work`, `/tmp`, `/dev/shm`, fresh `/proc`
//!    with `/proc/sys` read-only, a devpts instance of its own at `/dev/pts`, `pivot_root`
//!    into the template, detach the old root;
//! 3. new cgroup namespace, hostname, `setsid` (its own session: no TIOCSTI on a shared tty);
//! 4. stdin/stdout/stderr, rlimits;
//! 5. identity: drop the capability bounding set, `setgroups([])`, `setresgid`/`setresuid` to
//!    the box user (an unprivileged host id underneath), clear every capability set,
//!    `no_new_privs`, parent-death signal;
//! 6. working directory, default signal dispositions, empty signal mask;
//! 7. seccomp, last: install the filter, hand its listener fd to the supervisor, close it;
//! 8. `execve` (each `PATH` candidate in turn).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::RawFd;

use crate::mounts::ChildPaths;
use crate::seccomp::Filter;
use crate::sys::{syscall3, syscall5, syscall6};

/// Declares [`Step`] with the text of each step in one table: the enum, its decoding and its
/// description cannot drift apart.
macro_rules! steps {
    ($($(#[$doc:meta])* $name:ident $(= $value:literal)? => $text:literal,)*) => {
        /// The steps a child can fail at, reported to the parent.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u32)]
        pub enum Step {
            $($(#[$doc])* $name $(= $value)?,)*
        }

        impl Step {
            const ALL: &'static [Step] = &[$(Step::$name,)*];

            /// Decodes a step number.
            pub fn from_u32(v: u32) -> Option<Step> {
                Self::ALL.iter().copied().find(|s| *s as u32 == v)
            }

            /// What the step does, for error messages.
            pub fn describe(self) -> &'static str {
                match self {
                    $(Step::$name => $text,)*
                }
            }
        }
    };
}

steps! {
    Sync = 1 => "waiting for the supervisor",
    BindRoot => "binding the root template",
    MountRun => "attaching the run tmpfs (move_mount)",
    BindWork => "binding /work",
    BindTmp => "binding /tmp",
    BindShm => "binding /dev/shm",
    MountProc => "mounting /proc",
    BindProcSys => "binding /proc/sys",
    MountPts => "mounting the box's own /dev/pts (devpts)",
    RemountProcSys => "making /proc/sys read-only",
    ChdirRoot => "entering the new root",
    PivotRoot => "pivot_root",
    DetachOldRoot => "detaching the host root",
    CgroupNs => "unsharing the cgroup namespace",
    MountCgroup => "mounting the box's own /sys/fs/cgroup (cgroup2)",
    Hostname => "setting the hostname",
    Setsid => "setsid",
    Stdio => "setting up stdin/stdout/stderr",
    Rlimit => "setting rlimits",
    CapBound => "dropping the capability bounding set",
    Setgroups => "setgroups",
    Setgid => "setresgid",
    Setuid => "setresuid",
    Capset => "clearing capabilities",
    NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
    DeathSig => "PR_SET_PDEATHSIG",
    Chdir => "entering the working directory",
    Signals => "resetting signal dispositions",
    Seccomp => "installing the seccomp filter",
    SendListener => "handing the seccomp listener to the supervisor",
    Exec => "execve",
    Spawn => "starting the program's process",
    /// Not a failure: the program has started (pid 1 is becoming its init).
    Started => "started",
}

/// Everything the child needs, built before the clone. Raw pointers point into `CString`s and
/// vectors owned by the plan's owner, which outlives the child's use of them (the parent waits
/// for `execve` or for the child's exit before dropping them).
pub struct ChildPlan<'a> {
    pub paths: &'a ChildPaths,
    pub run_mount_fd: RawFd,
    pub sync_read: RawFd,
    pub status_write: RawFd,
    pub listener_sock: RawFd,
    pub stdin_fd: RawFd,
    pub stdout_fd: RawFd,
    pub stderr_fd: RawFd,
    pub rlimits: &'a [(u32, libc::rlimit64)],
    pub cap_last: u32,
    pub box_id: u32,
    pub hostname: &'a [u8],
    pub cwd: &'a CString,
    pub exec_paths: &'a [CString],
    pub argv: &'a [*const c_char],
    pub envp: &'a [*const c_char],
    pub filter: &'a Filter,
    /// `-1` for an ordinary run. Otherwise the box is a warm interpreter: this fd becomes its
    /// fd 3 (its control socket), it stays root of its user namespace with its capabilities,
    /// gets no seccomp filter, and its `/proc` stays fully visible (so that its children can
    /// mount their own).
    pub zygote_control: RawFd,
    /// `-1`, or a detached mount to attach at `/work` instead of the run tmpfs's `work/`.
    pub work_mount_fd: RawFd,
    /// Top of the second stack, for the program's own process (pid 2).
    pub stack2_top: *mut c_void,
    /// `/.agentrl/init`.
    pub init_path: &'a CStr,
    /// Whether the host process was dumpable: until `execve` the child shares its memory, and
    /// every uid change clears that (memory-wide) flag, so each one restores it.
    pub host_dumpable: bool,
    /// Mount a cgroup2 file system read-only at `/sys/fs/cgroup` once the box's cgroup
    /// namespace exists (cgroup v2): the box's own cgroup as the whole tree, as a container
    /// sees its own.
    pub mount_cgroup2: bool,
}

const MOVE_MOUNT_F_EMPTY_PATH: usize = 0x4;
const EMPTY: &[u8] = b"\0";
const ROOT: &[u8] = b"/\0";
const DOT: &[u8] = b".\0";
const PROC: &[u8] = b"proc\0";
const DEVPTS: &[u8] = b"devpts\0";
const CGROUP2: &[u8] = b"cgroup2\0";
const SYS_FS_CGROUP: &[u8] = b"/sys/fs/cgroup\0";
/// A devpts instance of the box's own (implied in a user namespace; `newinstance` says so
/// on older kernels too): anyone may open `/dev/ptmx`, a new terminal is its opener's, mode
/// 0620, as on a host.
pub(crate) const DEVPTS_OPTIONS: &[u8] = b"newinstance,ptmxmode=0666,mode=620\0";

/// Writes one 8-byte status record (step, errno). Async-signal-safe.
#[inline(always)]
fn write_record(fd: RawFd, step: Step, errno: i32) {
    let mut rec = [0u8; 8];
    let s = (step as u32).to_ne_bytes();
    let e = errno.to_ne_bytes();
    let mut i = 0;
    while i < 4 {
        rec[i] = s[i];
        rec[4 + i] = e[i];
        i += 1;
    }
    // SAFETY: rec is a valid 8-byte buffer; a failed write changes nothing.
    unsafe { syscall3(libc::SYS_write, fd as usize, rec.as_ptr() as usize, 8) };
}

#[inline(always)]
fn report(fd: RawFd, step: Step, errno: i32) -> ! {
    let mut rec = [0u8; 8];
    let s = (step as u32).to_ne_bytes();
    let e = errno.to_ne_bytes();
    let mut i = 0;
    while i < 4 {
        rec[i] = s[i];
        rec[4 + i] = e[i];
        i += 1;
    }
    // SAFETY: rec is a valid 8-byte buffer; fd is our status pipe (or any fd: a failed write
    // changes nothing). exit_group never returns.
    unsafe {
        syscall3(libc::SYS_write, fd as usize, rec.as_ptr() as usize, 8);
        syscall3(
            libc::SYS_exit_group,
            if step == Step::Exec { 127 } else { 126 },
            0,
            0,
        );
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

macro_rules! step {
    ($plan:expr, $step:expr, $call:expr) => {{
        let r = $call;
        if r < 0 {
            report($plan.status_write, $step, (-r) as i32);
        }
        r
    }};
}

/// The child's entry point (called by `clone` on the prepared stack).
///
/// Only [`clone_child`] calls it, with `arg` pointing to a live [`ChildPlan`] whose pointers
/// are valid, in the child of a `clone` with `CLONE_VM` on a private stack.
extern "C" fn child_entry(arg: *mut c_void) -> c_int {
    // SAFETY: clone_child passes a pointer to a ChildPlan that outlives the child's use.
    let plan = unsafe { &*(arg as *const ChildPlan<'_>) };
    // SAFETY: every call below is a raw system call on pointers from the plan, which the
    // parent keeps alive until this process has exec'd or exited.
    unsafe { child_main(plan) }
}

unsafe fn child_main(p: &ChildPlan<'_>) -> ! {
    let paths = p.paths;
    // SAFETY (whole function): raw system calls with NUL-terminated strings and buffers that
    // the plan owns; failures are reported and end the child.
    unsafe {
        // 1. Inherited fds: all close at exec, except the stdio we set up below.
        syscall3(
            libc::SYS_close_range,
            3,
            u32::MAX as usize,
            libc::CLOSE_RANGE_CLOEXEC as usize,
        );
        let mut b = [0u8; 1];
        let r = syscall3(
            libc::SYS_read,
            p.sync_read as usize,
            b.as_mut_ptr() as usize,
            1,
        );
        if r != 1 {
            report(
                p.status_write,
                Step::Sync,
                if r < 0 { (-r) as i32 } else { libc::EPIPE },
            );
        }

        // 2. File system. The template arrived as a copy from the slot's namespace, locked
        // (copied into a less privileged user namespace), and pivot_root refuses a locked new
        // root: a recursive bind of it onto itself gives this namespace a mount of its own.
        step!(
            p,
            Step::BindRoot,
            syscall5(
                libc::SYS_mount,
                paths.root.as_ptr() as usize,
                paths.root.as_ptr() as usize,
                0,
                (libc::MS_BIND | libc::MS_REC) as usize,
                0
            )
        );
        step!(
            p,
            Step::MountRun,
            syscall5(
                libc::SYS_move_mount,
                p.run_mount_fd as usize,
                EMPTY.as_ptr() as usize,
                libc::AT_FDCWD as usize,
                paths.run.as_ptr() as usize,
                MOVE_MOUNT_F_EMPTY_PATH
            )
        );
        if p.work_mount_fd >= 0 {
            // A session's persistent work dir (an overlay the parent built).
            step!(
                p,
                Step::BindWork,
                syscall5(
                    libc::SYS_move_mount,
                    p.work_mount_fd as usize,
                    EMPTY.as_ptr() as usize,
                    libc::AT_FDCWD as usize,
                    paths.work.as_ptr() as usize,
                    MOVE_MOUNT_F_EMPTY_PATH
                )
            );
        } else {
            step!(
                p,
                Step::BindWork,
                syscall5(
                    libc::SYS_mount,
                    paths.run_work.as_ptr() as usize,
                    paths.work.as_ptr() as usize,
                    0,
                    libc::MS_BIND as usize,
                    0
                )
            );
        }
        for (src, dst, s) in [
            (&paths.run_tmp, &paths.tmp, Step::BindTmp),
            (&paths.run_shm, &paths.shm, Step::BindShm),
        ] {
            step!(
                p,
                s,
                syscall5(
                    libc::SYS_mount,
                    src.as_ptr() as usize,
                    dst.as_ptr() as usize,
                    0,
                    libc::MS_BIND as usize,
                    0
                )
            );
        }
        // `/.run` stays attached (detaching it would cost an RCU grace period per run): its
        // root is mode 0711 and owned by host root, so the box can neither list nor change it,
        // and it holds nothing that /work, /tmp and /dev/shm do not already show.
        step!(
            p,
            Step::MountProc,
            syscall5(
                libc::SYS_mount,
                PROC.as_ptr() as usize,
                paths.proc_.as_ptr() as usize,
                PROC.as_ptr() as usize,
                (libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC) as usize,
                0
            )
        );
        if p.zygote_control < 0 {
            step!(
                p,
                Step::BindProcSys,
                syscall5(
                    libc::SYS_mount,
                    paths.proc_sys.as_ptr() as usize,
                    paths.proc_sys.as_ptr() as usize,
                    0,
                    (libc::MS_BIND | libc::MS_REC) as usize,
                    0
                )
            );
            step!(
                p,
                Step::RemountProcSys,
                syscall5(
                    libc::SYS_mount,
                    0,
                    paths.proc_sys.as_ptr() as usize,
                    0,
                    (libc::MS_BIND
                        | libc::MS_REMOUNT
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC) as usize,
                    0
                )
            );
        }
        step!(
            p,
            Step::MountPts,
            syscall5(
                libc::SYS_mount,
                DEVPTS.as_ptr() as usize,
                paths.pts.as_ptr() as usize,
                DEVPTS.as_ptr() as usize,
                (libc::MS_NOSUID | libc::MS_NOEXEC) as usize,
                DEVPTS_OPTIONS.as_ptr() as usize
            )
        );
        step!(
            p,
            Step::ChdirRoot,
            syscall3(libc::SYS_chdir, paths.root.as_ptr() as usize, 0, 0)
        );
        step!(
            p,
            Step::PivotRoot,
            syscall3(
                libc::SYS_pivot_root,
                DOT.as_ptr() as usize,
                DOT.as_ptr() as usize,
                0
            )
        );
        step!(
            p,
            Step::DetachOldRoot,
            syscall3(
                libc::SYS_umount2,
                DOT.as_ptr() as usize,
                libc::MNT_DETACH as usize,
                0
            )
        );
        step!(
            p,
            Step::ChdirRoot,
            syscall3(libc::SYS_chdir, ROOT.as_ptr() as usize, 0, 0)
        );

        // 3. Namespaces that need the slot's cgroup first, hostname, session.
        step!(
            p,
            Step::CgroupNs,
            syscall3(libc::SYS_unshare, libc::CLONE_NEWCGROUP as usize, 0, 0)
        );
        if p.mount_cgroup2 {
            // A cgroup2 mount shows the tree from the mounter's cgroup namespace root: the
            // box's own cgroup, which it may read (the box's ids do not own its files).
            step!(
                p,
                Step::MountCgroup,
                syscall5(
                    libc::SYS_mount,
                    CGROUP2.as_ptr() as usize,
                    SYS_FS_CGROUP.as_ptr() as usize,
                    CGROUP2.as_ptr() as usize,
                    (libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC) as usize,
                    0
                )
            );
        }
        step!(
            p,
            Step::Hostname,
            syscall3(
                libc::SYS_sethostname,
                p.hostname.as_ptr() as usize,
                p.hostname.len(),
                0
            )
        );
        step!(p, Step::Setsid, syscall3(libc::SYS_setsid, 0, 0, 0));

        // 4. Standard streams and rlimits.
        for (fd, target) in [(p.stdin_fd, 0usize), (p.stdout_fd, 1), (p.stderr_fd, 2)] {
            step!(
                p,
                Step::Stdio,
                syscall3(libc::SYS_dup3, fd as usize, target, 0)
            );
        }
        // Close (not only mark close-on-exec) every other inherited fd: the host may hold more
        // fds than the box's RLIMIT_NOFILE, and the seccomp listener needs a low free number.
        close_all_but([p.status_write, p.listener_sock, p.zygote_control]);
        for (res, lim) in p.rlimits {
            step!(
                p,
                Step::Rlimit,
                syscall6(
                    libc::SYS_prlimit64,
                    0,
                    *res as usize,
                    lim as *const libc::rlimit64 as usize,
                    0,
                    0,
                    0
                )
            );
        }

        // 5. Identity, and the program's own process.
        if p.zygote_control >= 0 {
            // A warm interpreter stays root of its user namespace (an unprivileged host id)
            // and keeps its capabilities there; it only runs agentrl's own bootstrap.
            step!(p, Step::Setgroups, syscall3(libc::SYS_setgroups, 0, 0, 0));
            step!(p, Step::Setgid, syscall3(libc::SYS_setresgid, 0, 0, 0));
            step!(p, Step::Setuid, syscall3(libc::SYS_setresuid, 0, 0, 0));
            restore_dumpable(p);
            step!(
                p,
                Step::DeathSig,
                syscall3(
                    libc::SYS_prctl,
                    libc::PR_SET_PDEATHSIG as usize,
                    libc::SIGKILL as usize,
                    0
                )
            );
            let fd = p.zygote_control as usize;
            if fd == 3 {
                step!(
                    p,
                    Step::Stdio,
                    syscall3(libc::SYS_fcntl, 3, libc::F_SETFD as usize, 0)
                );
            } else {
                step!(p, Step::Stdio, syscall3(libc::SYS_dup3, fd, 3, 0));
            }
            program_tail(p)
        }
        // This process is pid 1 of the box. It becomes root of the user namespace on the
        // slot's second unprivileged host id, starts the program as pid 2 (a vfork on the
        // second stack: the program's own set-up runs in `program_main`), then drops what it
        // had and becomes the box's init (see `crate::init`).
        step!(p, Step::Setgroups, syscall3(libc::SYS_setgroups, 0, 0, 0));
        step!(p, Step::Setgid, syscall3(libc::SYS_setresgid, 0, 0, 0));
        step!(p, Step::Setuid, syscall3(libc::SYS_setresuid, 0, 0, 0));
        restore_dumpable(p);
        step!(
            p,
            Step::DeathSig,
            syscall3(
                libc::SYS_prctl,
                libc::PR_SET_PDEATHSIG as usize,
                libc::SIGKILL as usize,
                0
            )
        );
        let pid2 = libc::clone(
            program_entry,
            p.stack2_top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            p as *const ChildPlan<'_> as *mut c_void,
        );
        if pid2 < 0 {
            report(p.status_write, Step::Spawn, libc::EAGAIN);
        }
        // The program has exec'd, or reported its failure and exited.
        drop_capabilities(p);
        step!(
            p,
            Step::NoNewPrivs,
            syscall6(
                libc::SYS_prctl,
                libc::PR_SET_NO_NEW_PRIVS as usize,
                1,
                0,
                0,
                0,
                0
            )
        );
        // Once "started" is written the supervisor may free the plan: copy what is still
        // needed (the init's path lives in the slot, which outlives the box).
        let status = p.status_write;
        let init = p.init_path.as_ptr();
        write_record(status, Step::Started, 0);
        if status == 3 {
            syscall3(libc::SYS_fcntl, 3, libc::F_SETFD as usize, 0);
        } else {
            syscall3(libc::SYS_dup3, status as usize, 3, 0);
        }
        syscall3(libc::SYS_close_range, 0, 2, 0);
        syscall3(libc::SYS_close_range, 4, u32::MAX as usize, 0);
        let init_argv: [*const c_char; 2] = [init, std::ptr::null()];
        let init_envp: [*const c_char; 1] = [std::ptr::null()];
        syscall3(
            libc::SYS_execve,
            init as usize,
            init_argv.as_ptr() as usize,
            init_envp.as_ptr() as usize,
        );
        // Without its init the box cannot report: the supervisor sees no exit record.
        syscall3(libc::SYS_exit_group, 126, 0, 0);
        #[allow(clippy::empty_loop)]
        loop {}
    }
}

/// See [`ChildPlan::host_dumpable`].
#[inline(always)]
fn restore_dumpable(p: &ChildPlan<'_>) {
    if p.host_dumpable {
        // SAFETY: prctl with flags only.
        unsafe { syscall3(libc::SYS_prctl, libc::PR_SET_DUMPABLE as usize, 1, 0) };
    }
}

/// Clears every capability set (the bounding set is left to the caller).
///
/// # Safety
/// Raw system calls with valid stack buffers only.
unsafe fn drop_capabilities(p: &ChildPlan<'_>) {
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [CapData::default(), CapData::default()];
    // SAFETY: capset with a valid header and two data entries (version 3).
    unsafe {
        step!(
            p,
            Step::Capset,
            syscall3(
                libc::SYS_capset,
                &header as *const CapHeader as usize,
                data.as_ptr() as usize,
                0
            )
        );
        step!(
            p,
            Step::Capset,
            syscall6(
                libc::SYS_prctl,
                libc::PR_CAP_AMBIENT as usize,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as usize,
                0,
                0,
                0,
                0
            )
        );
    }
}

/// Entry of pid 2, the program (a vfork of pid 1 on the plan's second stack).
extern "C" fn program_entry(arg: *mut c_void) -> c_int {
    // SAFETY: pid 1 passes its plan, which outlives this process's use of it (pid 1 is
    // suspended until this process execs or exits).
    let p = unsafe { &*(arg as *const ChildPlan<'_>) };
    // SAFETY: raw system calls over the plan, as in child_main.
    unsafe { program_main(p) }
}

/// pid 2: the box user, no capabilities, `no_new_privs`, then [`program_tail`].
unsafe fn program_main(p: &ChildPlan<'_>) -> ! {
    // SAFETY (whole function): raw system calls on buffers the plan owns.
    unsafe {
        let mut cap = 0;
        while cap <= p.cap_last {
            step!(
                p,
                Step::CapBound,
                syscall3(
                    libc::SYS_prctl,
                    libc::PR_CAPBSET_DROP as usize,
                    cap as usize,
                    0
                )
            );
            cap += 1;
        }
        step!(p, Step::Setgroups, syscall3(libc::SYS_setgroups, 0, 0, 0));
        let id = p.box_id as usize;
        step!(p, Step::Setgid, syscall3(libc::SYS_setresgid, id, id, id));
        step!(p, Step::Setuid, syscall3(libc::SYS_setresuid, id, id, id));
        restore_dumpable(p);
        drop_capabilities(p);
        step!(
            p,
            Step::NoNewPrivs,
            syscall6(
                libc::SYS_prctl,
                libc::PR_SET_NO_NEW_PRIVS as usize,
                1,
                0,
                0,
                0,
                0
            )
        );
        step!(
            p,
            Step::DeathSig,
            syscall3(
                libc::SYS_prctl,
                libc::PR_SET_PDEATHSIG as usize,
                libc::SIGKILL as usize,
                0
            )
        );
        program_tail(p)
    }
}

/// Working directory, signals, seccomp (not for a warm interpreter) and `execve`.
unsafe fn program_tail(p: &ChildPlan<'_>) -> ! {
    // SAFETY (whole function): raw system calls on buffers the plan owns.
    unsafe {
        // 6. Working directory and signals.
        step!(
            p,
            Step::Chdir,
            syscall3(libc::SYS_chdir, p.cwd.as_ptr() as usize, 0, 0)
        );
        let dfl = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        let mut sig = 1;
        while sig <= 64 {
            if sig != libc::SIGKILL as usize && sig != libc::SIGSTOP as usize {
                syscall6(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl as *const KernelSigaction as usize,
                    0,
                    8,
                    0,
                    0,
                );
            }
            sig += 1;
        }
        let empty: u64 = 0;
        step!(
            p,
            Step::Signals,
            syscall6(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK as usize,
                &empty as *const u64 as usize,
                0,
                8,
                0,
                0
            )
        );

        // 7. Seccomp, last (not for the warm interpreter: its children install it).
        if p.zygote_control < 0 {
            let listener = match p.filter.install() {
                Ok(fd) => fd,
                Err(e) => report(p.status_write, Step::Seccomp, e),
            };
            step!(
                p,
                Step::SendListener,
                crate::seccomp::send_fd(p.listener_sock, listener)
            );
            syscall3(libc::SYS_close, listener as usize, 0, 0);
        }

        // 8. Exec.
        let mut err = libc::ENOENT;
        for path in p.exec_paths {
            let r = syscall3(
                libc::SYS_execve,
                path.as_ptr() as usize,
                p.argv.as_ptr() as usize,
                p.envp.as_ptr() as usize,
            );
            let e = (-r) as i32;
            if e != libc::ENOENT && e != libc::ENOTDIR {
                err = e;
            }
        }
        report(p.status_write, Step::Exec, err)
    }
}

/// Closes every fd from 3 up except the (at most three) given ones; negative entries are
/// ignored. Async-signal-safe: no allocation, raw `close_range` calls.
fn close_all_but(mut keep: [RawFd; 3]) {
    // Sort the three by hand (no allocation).
    for i in 0..3 {
        for j in i + 1..3 {
            if keep[j] < keep[i] {
                keep.swap(i, j);
            }
        }
    }
    let mut from: u32 = 3;
    for k in keep {
        if k < 3 {
            continue;
        }
        let k = k as u32;
        if k > from {
            // SAFETY: close_range on our own fd table; no memory is passed.
            unsafe { syscall3(libc::SYS_close_range, from as usize, (k - 1) as usize, 0) };
        }
        from = k + 1;
    }
    // SAFETY: as above.
    unsafe { syscall3(libc::SYS_close_range, from as usize, u32::MAX as usize, 0) };
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The kernel's `struct sigaction` (x86_64 and aarch64 share its layout).
#[repr(C)]
pub(crate) struct KernelSigaction {
    pub handler: libc::sighandler_t,
    pub flags: u64,
    pub restorer: usize,
    pub mask: u64,
}

/// A stack for the clone child: an anonymous mapping with a guard page at its low end.
pub struct ChildStack {
    base: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it is used by one child at a time.
unsafe impl Send for ChildStack {}

impl ChildStack {
    /// Maps `len` bytes plus a guard page.
    pub fn new(len: usize) -> std::io::Result<ChildStack> {
        let page = 4096;
        let total = len + page;
        // SAFETY: anonymous private mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the first page of our own mapping becomes the guard.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: unmapping what we mapped.
            unsafe { libc::munmap(base, total) };
            return Err(e);
        }
        Ok(ChildStack { base, len: total })
    }

    /// The initial stack pointer (top of the mapping, 16-byte aligned).
    pub fn top(&self) -> *mut c_void {
        // SAFETY: one-past-the-end of our own mapping.
        unsafe { (self.base as *mut u8).add(self.len) as *mut c_void }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping we own; no child uses it any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Clones the child. Returns `(pid, pidfd)`.
///
/// # Safety
/// `plan` must stay alive and unmodified until the child has exec'd or exited; `stack` must
/// not be used by another child at the same time; the calling thread should have every signal
/// blocked (the child inherits the mask and resets dispositions before unblocking).
pub unsafe fn clone_child(
    plan: &ChildPlan<'_>,
    stack: &ChildStack,
    flags: c_int,
) -> std::io::Result<(libc::pid_t, RawFd)> {
    let mut pidfd: c_int = -1;
    // SAFETY: child_entry matches the callback type; the stack top is valid; plan outlives the
    // child's use of it (caller's contract); &mut pidfd receives the pidfd (CLONE_PIDFD).
    let pid = unsafe {
        libc::clone(
            child_entry,
            stack.top(),
            flags | libc::CLONE_VM | libc::CLONE_PIDFD,
            plan as *const ChildPlan<'_> as *mut c_void,
            &mut pidfd as *mut c_int,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((pid, pidfd))
}

/// Builds a NULL-terminated pointer array over C strings.
pub fn ptr_array(v: &[CString]) -> Vec<*const c_char> {
    v.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Step;

    #[test]
    fn every_step_decodes_from_its_number_and_is_described() {
        for &s in Step::ALL {
            assert_eq!(Step::from_u32(s as u32), Some(s));
            assert!(!s.describe().is_empty());
        }
        assert_eq!(Step::Sync as u32, 1);
        assert_eq!(Step::from_u32(0), None);
        assert_eq!(Step::from_u32(Step::Started as u32 + 1), None);
    }
}
