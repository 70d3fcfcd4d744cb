//! The box's pid 1, from the clone to the box's init: steps 1 to 5 of the pipeline in
//! `docs/design/spawn.md` (fds, mounts and `pivot_root`, namespaces, standard streams and
//! rlimits, its own identity), then it starts the program as pid 2 (see `program`) and
//! execs the init. A warm interpreter goes straight on to `program_tail` instead.

use std::ffi::{c_char, c_int, c_void};
use std::os::fd::RawFd;

use super::identity::{drop_capabilities, restore_dumpable};
use super::program::{program_entry, program_tail};
use super::status::{report, step, write_record};
use super::{ChildPlan, Step};
use crate::sys::{syscall3, syscall5, syscall6};

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

/// The child's entry point (called by `clone` on the prepared stack).
///
/// Only [`clone_child`](super::clone_child) calls it, with `arg` pointing to a live
/// [`ChildPlan`] whose pointers are valid, in the child of a `clone` with `CLONE_VM` on a
/// private stack.
pub(super) extern "C" fn child_entry(arg: *mut c_void) -> c_int {
    // SAFETY: clone_child passes a pointer to a ChildPlan that outlives the child's use.
    let plan = unsafe { &*(arg as *const ChildPlan<'_>) };
    // SAFETY: every call below is a raw system call on pointers from the plan, which the
    // parent keeps alive until this process has exec'd or exited.
    unsafe { child_main(plan) }
}

/// Steps 1 to 5 of the pipeline, then pid 2 and the init (see the module doc).
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
        if p.warm_control < 0 {
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
        close_all_but([p.status_write, p.listener_sock, p.warm_control]);
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
        if p.warm_control >= 0 {
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
            let fd = p.warm_control as usize;
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
