//! In the forked run: building its view and dropping every privilege as a cold run does
//! (`child_setup`), with the seccomp filters and capability count prepared once per
//! interpreter ([`interpreter_init`]).

use std::os::fd::RawFd;
use std::sync::OnceLock;

use super::wire::{decode, Env};
use crate::mounts::BOX_ID;
use crate::seccomp::{self, Filter, Policy};
use crate::spawn::Step;

static FILTERS: OnceLock<(Filter, Filter)> = OnceLock::new();

/// The highest capability number, read once (a run would otherwise read `/proc` for it).
static CAP_LAST: OnceLock<u32> = OnceLock::new();

/// Compiles both seccomp policies once, before any fork (so children only install them).
pub fn interpreter_init() {
    CAP_LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40)
    });
    FILTERS.get_or_init(|| {
        (
            Filter::compile(&Policy {
                allow_network: false,
            }),
            Filter::compile(&Policy {
                allow_network: true,
            }),
        )
    });
}

/// Clears every capability set of the calling thread.
fn clear_capabilities() -> Result<(), i32> {
    let header = [0x2008_0522u32, 0];
    let data = [0u32; 6];
    // SAFETY: capset with a version-3 header and two data entries; prctl with flags only.
    unsafe {
        if libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) < 0
            || libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            ) < 0
        {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EPERM));
        }
    }
    Ok(())
}

/// In the forked child: builds the run's view and drops every privilege, exactly as a cold
/// run does, then closes every fd but 0/1/2 and the fds passed to the run. `fds` are, in
/// order: run tmpfs, stdin, stdout, stderr, status pipe, listener socket, the "go" pipe, then
/// the fds passed to the run ([`crate::RunRequest::pass_fds`]), which become its fds 3, 4, ...
/// Returns the environment to install (`None`: the interpreter's own, `own_env` as
/// [`encode_env`](super::encode_env) writes it); on failure it reports the step on the status pipe and exits
/// with status 126. The "go" pipe is read once everything else is done: the supervisor writes
/// to it after moving this process into the slot's cgroup.
pub(super) fn child_setup(payload: &[u8], fds: &[RawFd], own_env: &[u8]) -> Option<Env> {
    let status = fds.get(4).copied().unwrap_or(-1);
    let fail = |step: Step, errno: i32| -> ! {
        let mut rec = [0u8; 8];
        rec[..4].copy_from_slice(&(step as u32).to_ne_bytes());
        rec[4..].copy_from_slice(&errno.to_ne_bytes());
        // SAFETY: writing a valid buffer, then leaving the process without unwinding.
        unsafe {
            libc::write(status, rec.as_ptr().cast(), 8);
            libc::_exit(126)
        }
    };
    let last = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    let Some(req) = decode(payload, own_env) else {
        fail(Step::Sync, libc::EINVAL)
    };
    if fds.len() < 7 || fds.len() > 7 + crate::config::MAX_PASS_FDS {
        fail(Step::Sync, libc::EBADF);
    }
    let passed = &fds[7..];
    let ok = |r: libc::c_int, step: Step| {
        if r < 0 {
            fail(step, last());
        }
    };
    // SAFETY (whole block): plain system calls on valid paths and fds in a single-threaded
    // forked child; every failure ends the process.
    unsafe {
        ok(libc::unshare(libc::CLONE_NEWNS), Step::MountRun);
        let (empty, run) = (c"", c"/.run");
        let r = libc::syscall(
            libc::SYS_move_mount,
            fds[0],
            empty.as_ptr(),
            libc::AT_FDCWD,
            run.as_ptr(),
            0x4u32,
        );
        ok(r as libc::c_int, Step::MountRun);
        for (src, dst, step) in [
            (c"/.run/work", c"/work", Step::BindWork),
            (c"/.run/tmp", c"/tmp", Step::BindTmp),
            (c"/.run/shm", c"/dev/shm", Step::BindShm),
        ] {
            let (s, d) = (src, dst);
            ok(
                libc::mount(
                    s.as_ptr(),
                    d.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ),
                step,
            );
        }
        let (proc_, sys) = (c"/proc", c"/proc/sys");
        let fstype = c"proc";
        ok(
            libc::mount(
                fstype.as_ptr(),
                proc_.as_ptr(),
                fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ),
            Step::MountProc,
        );
        ok(
            libc::mount(
                sys.as_ptr(),
                sys.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ),
            Step::BindProcSys,
        );
        ok(
            libc::mount(
                std::ptr::null(),
                sys.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND
                    | libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | libc::MS_NOEXEC,
                std::ptr::null(),
            ),
            Step::RemountProcSys,
        );
        // A devpts instance of the run's own: no run sees another's terminals.
        let (devpts, pts) = (c"devpts", c"/dev/pts");
        ok(
            libc::mount(
                devpts.as_ptr(),
                pts.as_ptr(),
                devpts.as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                crate::spawn::DEVPTS_OPTIONS.as_ptr().cast(),
            ),
            Step::MountPts,
        );
        ok(libc::setsid(), Step::Setsid);
        for (fd, target) in [(fds[1], 0), (fds[2], 1), (fds[3], 2)] {
            ok(libc::dup2(fd, target), Step::Stdio);
        }
        // The passed fds become 3, 4, ... at the end; first each is copied above that range,
        // where no later step can take its number.
        let first = 3 + passed.len() as libc::c_int;
        let mut high = [-1; crate::config::MAX_PASS_FDS];
        for (h, &fd) in high.iter_mut().zip(passed) {
            *h = libc::fcntl(fd, libc::F_DUPFD, first);
            ok(*h, Step::Stdio);
        }
        for (res, lim) in &req.rlimits {
            ok(
                libc::prlimit64(0, *res, lim, std::ptr::null_mut()),
                Step::Rlimit,
            );
        }
        // Wait until the supervisor releases the run.
        let mut b = [0u8; 1];
        if libc::read(fds[6], b.as_mut_ptr().cast(), 1) != 1 {
            fail(Step::Sync, libc::EPIPE);
        }
        // The OOM killer must pick the run, never its interpreter: a run that fills its
        // cgroup with tmpfs pages (which count to no process) would otherwise leave the
        // interpreter as the largest process. Raising one's own score needs no privilege; the
        // run's init and program inherit it.
        let adj = c"/proc/self/oom_score_adj";
        let fd = libc::open(adj.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 || libc::write(fd, b"1000".as_ptr().cast(), 4) != 4 {
            fail(Step::Setsid, last());
        }
        libc::close(fd);
        interpreter_init();
        let cap_last = *CAP_LAST.get().expect("initialised above");
        for cap in 0..=cap_last {
            ok(
                libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0),
                Step::CapBound,
            );
        }
        ok(libc::setgroups(0, std::ptr::null()), Step::Setgroups);
        ok(libc::setresgid(BOX_ID, BOX_ID, BOX_ID), Step::Setgid);
        ok(libc::setresuid(BOX_ID, BOX_ID, BOX_ID), Step::Setuid);
        // Changing uid made the process non-dumpable (root-owned /proc/self files); an
        // execve would have made it dumpable again, as a cold run is.
        ok(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0), Step::Setuid);
        clear_capabilities().unwrap_or_else(|e| fail(Step::Capset, e));
        ok(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            Step::NoNewPrivs,
        );
        ok(
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ),
            Step::DeathSig,
        );
        ok(libc::chdir(req.cwd.as_ptr()), Step::Chdir);
        interpreter_init();
        let (plain, net) = FILTERS.get().expect("initialised above");
        let filter = if req.network { net } else { plain };
        let listener = match filter.install() {
            Ok(fd) => fd,
            Err(e) => fail(Step::Seccomp, e),
        };
        if seccomp::send_fd(fds[5], listener) < 0 {
            fail(Step::SendListener, last());
        }
        libc::close(listener);
        let mut rec = [0u8; 8];
        rec[..4].copy_from_slice(&(Step::Started as u32).to_ne_bytes());
        libc::write(status, rec.as_ptr().cast(), 8);
        // The passed fds into place as 3, 4, ... (dup2 clears close-on-exec); what those
        // numbers held is no longer needed. dup2 of an open fd below the fd limit only fails
        // on a kernel race (EBUSY), after the supervisor was told the run started: the run
        // then ends with status 126.
        for (i, &h) in high[..passed.len()].iter().enumerate() {
            if libc::dup2(h, 3 + i as libc::c_int) < 0 {
                libc::_exit(126);
            }
        }
        // Nothing of the interpreter's stays open: not its control socket, not the request.
        libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32);
    }
    req.env
}
