//! The interpreter's side (called through the binding inside the warm interpreter): the
//! request loop ([`serve`]) and its namespace and request helpers.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use super::child::child_setup;
use super::idle_init::spawn_init;
use super::reap::report_exit;
use super::shown_args::ShownArgs;
use super::wire::Env;
use crate::fdpass;
use crate::supervise;

/// What the request loop needs from the interpreter it runs in.
pub trait Interpreter {
    /// Before each fork: flush buffered output, freeze the heap, and the like.
    fn before_fork(&mut self);
    /// Forks the interpreter the way its runtime requires; `Ok(0)` in the child.
    fn fork(&mut self) -> std::io::Result<libc::pid_t>;
    /// Runs a blocking wait, letting the interpreter's other threads (if any) go on.
    fn blocking<T: Send>(&mut self, f: impl FnOnce() -> T + Send) -> T;
}

/// The warm interpreter's request loop, on its control socket `ctl`. For each request it
/// starts the run's pid namespace with the idle init as pid 1 (`spawn_init`), forks the run
/// as pid 2, sends the supervisor the run's and the init's pidfds and then reports the run's
/// exit (`report_exit`). It returns in the run, once set up (`child_setup`), with the
/// environment to install (`None` for `own_env`, the interpreter's own as [`encode_env`](super::encode_env)
/// writes it), its `/proc/self/cmdline` reading `<interpreter> __main__.py` (`ShownArgs`);
/// in the interpreter only at end of file (`Ok(None)`) or when the control socket fails.
pub fn serve(
    ctl: std::os::fd::BorrowedFd<'_>,
    interp: &mut impl Interpreter,
    own_env: &[u8],
) -> std::io::Result<Option<Option<Env>>> {
    let shown = ShownArgs::new();
    // Whether the interpreter's IPC namespace is one no run has had yet (see
    // `unshare_ipc`): made between runs, off the path of any run, and only remade on a
    // request's path if that failed.
    let mut fresh_ipc = false;
    loop {
        if !fresh_ipc {
            fresh_ipc = unshare_ipc().is_ok();
        }
        let Some((mut payload, fds)) = interp.blocking(|| receive_request(ctl))? else {
            return Ok(None);
        };
        interp.before_fork();
        let close_all = |fds: &[RawFd]| {
            for &fd in fds {
                // SAFETY: closing fds received with the request, owned by this loop.
                unsafe { libc::close(fd) };
            }
        };
        let ipc = if fresh_ipc { Ok(()) } else { unshare_ipc() };
        let forked = ipc.and_then(|()| unshare_pid()).and_then(|()| {
            let (init_pid, init_fd) = spawn_init()?;
            match interp.fork() {
                Ok(pid) => Ok((pid, init_pid, init_fd)),
                Err(e) => {
                    kill_and_reap(init_pid);
                    Err(e)
                }
            }
        });
        let (pid, init_pid, init_fd) = match forked {
            Ok(f) => f,
            Err(e) => {
                wipe(&mut payload);
                close_all(&fds);
                fdpass::send(ctl, format!("E{e}").as_bytes(), &[])?;
                continue;
            }
        };
        if pid == 0 {
            drop(init_fd);
            let env = child_setup(&payload, &fds, own_env);
            shown.install(env.as_ref());
            return Ok(Some(env));
        }
        // This run (and its init) have the namespace now: the next run gets another.
        fresh_ipc = false;
        wipe(&mut payload);
        close_all(&fds);
        // SAFETY: pidfd_open on our own child, not yet reaped.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            let e = std::io::Error::last_os_error();
            kill_and_reap(pid);
            kill_and_reap(init_pid);
            fdpass::send(ctl, format!("Epidfd_open: {e}").as_bytes(), &[])?;
            continue;
        }
        // SAFETY: a fresh pidfd, owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
        let sent = fdpass::send(ctl, b"P", &[pidfd.as_raw_fd(), init_fd.as_raw_fd()]);
        drop((pidfd, init_fd));
        sent?;
        interp.blocking(|| report_exit(ctl, pid, init_pid))?;
    }
}

/// Gives the kernel back the free pages of the interpreter's `malloc` heap, once started and
/// before it says so: compiling preloaded sources leaves freed but resident heap behind (1.9
/// of 11.5 MB for the Evaluator's harness), which every fork would copy the page table entries
/// of and every exit tear down. It must come before the interpreter reports ready: the
/// supervisor then samples the slot's memory as the interpreter's baseline, which each run's
/// memory limit is counted above.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of glibc's own arenas to the kernel; the
    // interpreter is single-threaded here.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The interpreter's own pid namespace (opened once).
static OWN_PID_NS: OnceLock<std::io::Result<OwnedFd>> = OnceLock::new();

/// Receives the next request on the control socket: its payload and fds, or `None` at end of
/// file. The caller wipes the payload once the run is forked (see `wipe`).
fn receive_request(
    ctl: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<Option<(Vec<u8>, Vec<RawFd>)>> {
    use std::os::fd::IntoRawFd;
    Ok(fdpass::recv(ctl, None)?
        .map(|(data, fds)| (data, fds.into_iter().map(|f| f.into_raw_fd()).collect())))
}

/// SIGKILLs the interpreter's own child `pid` and reaps it (for the run's init: once its pid
/// namespace is empty).
fn kill_and_reap(pid: libc::pid_t) {
    // SAFETY: SIGKILL to our own child, not yet reaped (so its pid is still its own).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    supervise::reap(pid);
}

/// Wipes a request (in the interpreter, once the run is forked): nothing of one run's request
/// stays in the memory the next fork copies into another run.
fn wipe(v: &mut Vec<u8>) {
    for b in v.iter_mut() {
        // SAFETY: writing a zero to a valid &mut u8; volatile so the wipe is not elided.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    v.clear();
}

/// Moves the interpreter into a new IPC namespace, for its next run to inherit at the fork.
///
/// A warm run must have an IPC namespace of its own, as a cold run does: in a shared one, the
/// SysV shared memory, semaphores and message queues and the POSIX message queues one run
/// creates would be there for the next (one episode could hand answers to later ones). The
/// interpreter uses no IPC itself, so instead of the run unsharing on its own path (about
/// 30 µs, most of it mounting the namespace's internal mqueue file system), the interpreter
/// moves into a fresh namespace between runs, and each is inherited by exactly one run (and
/// that run's init). The old one is freed by the kernel once its run is gone.
fn unshare_ipc() -> std::io::Result<()> {
    // SAFETY: unshare with a flag only; the interpreter is root of its user namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWIPC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the interpreter's next child the init of a new pid namespace. A process may unshare
/// its children's pid namespace only while that is still its own, so it first goes back to
/// its own (`setns`), then unshares afresh.
fn unshare_pid() -> std::io::Result<()> {
    let own =
        OWN_PID_NS.get_or_init(|| std::fs::File::open("/proc/self/ns/pid").map(OwnedFd::from));
    let own = own
        .as_ref()
        .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?;
    // SAFETY: setns/unshare with a valid namespace fd and flags only; the interpreter is
    // single-threaded.
    unsafe {
        if libc::setns(own.as_raw_fd(), libc::CLONE_NEWPID) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::unshare(libc::CLONE_NEWPID) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
