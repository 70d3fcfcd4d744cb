//! The program's own process (pid 2, a vfork of pid 1; or the warm interpreter itself):
//! steps 5 to 8 of the pipeline in `docs/design/spawn.md` (the box user, working
//! directory, signals, seccomp, `execve`).

use std::ffi::{c_int, c_void};

use super::identity::{drop_capabilities, restore_dumpable};
use super::status::{report, step};
use super::{ChildPlan, Step};
use crate::sys::{syscall3, syscall6};

/// Entry of pid 2, the program (a vfork of pid 1 on the plan's second stack).
pub(super) extern "C" fn program_entry(arg: *mut c_void) -> c_int {
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
pub(super) unsafe fn program_tail(p: &ChildPlan<'_>) -> ! {
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
        if p.warm_control < 0 {
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

/// The kernel's `struct sigaction` (x86_64 and aarch64 share its layout).
#[repr(C)]
pub(crate) struct KernelSigaction {
    pub handler: libc::sighandler_t,
    pub flags: u64,
    pub restorer: usize,
    pub mask: u64,
}
