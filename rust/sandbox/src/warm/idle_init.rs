//! The run's pid 1: the idle init of [`crate::init`], started by the interpreter with a
//! `clone(CLONE_VM | CLONE_VFORK)` and `execve` (`spawn_init`).

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::spawn::{ChildStack, KernelSigaction};
use crate::supervise;
use crate::sys::{syscall3, syscall6};

/// What the idle init's clone child needs, built before the clone.
struct InitPlan {
    path: CString,
    argv: [*const libc::c_char; 2],
    envp: [*const libc::c_char; 1],
    /// The errno of a failed step: the child shares our memory until `execve`.
    failed: AtomicI32,
}

/// The idle init's stack (one warm run at a time per interpreter).
static INIT_STACK: std::sync::Mutex<Option<ChildStack>> = std::sync::Mutex::new(None);

/// In the interpreter, after `unshare_pid`: starts the run's init, pid 1 of the new pid
/// namespace (the idle init of [`crate::init`]), and returns its pid and pidfd.
///
/// The init is a `clone(CLONE_VM | CLONE_VFORK)` child, as `posix_spawn` makes them: it
/// copies none of the interpreter's memory and runs only raw system calls until `execve`:
/// `SIGCHLD` ignored (the kernel then reaps the orphans it inherits), killed if the
/// interpreter dies, no fds, no capabilities, `no_new_privs`. It stays root of the
/// interpreter's user namespace, so the run (the box user) can neither signal nor trace it.
pub(super) fn spawn_init() -> std::io::Result<(libc::pid_t, OwnedFd)> {
    let mut guard = INIT_STACK.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(ChildStack::new(64 << 10)?);
    }
    let stack = guard.as_ref().expect("just set");
    let path = CString::new(crate::init::IDLE_PATH).expect("no NUL");
    let mut plan = InitPlan {
        argv: [path.as_ptr(), std::ptr::null()],
        envp: [std::ptr::null()],
        path,
        failed: AtomicI32::new(0),
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: init_entry matches the callback type and only reads the plan, which lives until
    // the child has exec'd or exited (CLONE_VFORK suspends us until then); the stack is ours
    // and used by one child at a time (the interpreter is single-threaded); &mut pidfd
    // receives the pidfd (CLONE_PIDFD).
    let pid = unsafe {
        libc::clone(
            init_entry,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            &mut plan as *mut InitPlan as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh pidfd from clone, owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let failed = plan.failed.load(Ordering::SeqCst);
    if failed != 0 {
        supervise::reap(pid);
        return Err(std::io::Error::from_raw_os_error(failed));
    }
    Ok((pid, pidfd))
}

extern "C" fn init_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: spawn_init passes a pointer to an InitPlan that outlives the child's use.
    let p = unsafe { &*(arg as *const InitPlan) };
    let fail = |r: isize| {
        if r < 0 {
            p.failed.store((-r) as i32, Ordering::SeqCst);
            // SAFETY: exit_group ends this process only (no CLONE_THREAD).
            unsafe { syscall3(libc::SYS_exit_group, 126, 0, 0) };
        }
    };
    let ignore = KernelSigaction {
        handler: libc::SIG_IGN,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    let header = [0x2008_0522u32, 0];
    let data = [0u32; 6];
    // SAFETY: raw system calls (no errno, no allocation, no lock) on buffers of this frame
    // and of the plan; our signal handlers and fd table are our own copies (no CLONE_SIGHAND,
    // no CLONE_FILES), so none of this touches the interpreter.
    unsafe {
        fail(syscall6(
            libc::SYS_rt_sigaction,
            libc::SIGCHLD as usize,
            &ignore as *const KernelSigaction as usize,
            0,
            8,
            0,
            0,
        ));
        fail(syscall3(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG as usize,
            libc::SIGKILL as usize,
            0,
        ));
        fail(syscall3(
            libc::SYS_capset,
            header.as_ptr() as usize,
            data.as_ptr() as usize,
            0,
        ));
        fail(syscall6(
            libc::SYS_prctl,
            libc::PR_SET_NO_NEW_PRIVS as usize,
            1,
            0,
            0,
            0,
            0,
        ));
        syscall3(libc::SYS_close_range, 0, u32::MAX as usize, 0);
        let r = syscall3(
            libc::SYS_execve,
            p.path.as_ptr() as usize,
            p.argv.as_ptr() as usize,
            p.envp.as_ptr() as usize,
        );
        fail(r.min(-1));
    }
    126
}
