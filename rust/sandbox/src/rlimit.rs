//! Per-process resource limits set in the child before `execve`.
//!
//! ## Core dumps
//! No box process may dump core, and above all none may start the host's core handler. When
//! `kernel.core_pattern` is a pipe (`|/usr/lib/systemd/systemd-coredump ...`, apport, abrt),
//! the kernel ignores `RLIMIT_CORE` for the dump itself and starts the handler as host root,
//! in the host's namespaces, for a crash anywhere, boxes included; the one exception is a
//! limit of exactly 1 byte, which it takes to mean "no core" (it is what it gives the
//! handler itself, against recursive dumps). A limit of 0 stops only core *files*. So every
//! box process, the warm interpreter and its runs included, gets `RLIMIT_CORE` 1 soft and
//! hard ([`NO_CORE`]): a core file of 1 byte is below the smallest the kernel writes (a
//! page), so no file appears either, and with the hard limit at 1 the program cannot raise
//! it. (Lowering it to 0 is always allowed, and only the seccomp policy could refuse that.)
//! The host process's own hard limit must be at least 1 for the box to get 1:
//! [`for_limits`] raises it once where it is 0 (the soft limit, the host's own, is left).

use crate::limits::Limits;

/// `RLIMIT_CORE` of every box process: 1 byte, soft and hard (see the module doc).
pub const NO_CORE: libc::rlimit64 = libc::rlimit64 {
    rlim_cur: 1,
    rlim_max: 1,
};

/// Raises this process's hard `RLIMIT_CORE` to 1 where it is 0 (once, best effort: it needs
/// `CAP_SYS_RESOURCE`), so that its boxes can be given [`NO_CORE`]; the soft limit stays.
pub fn allow_no_core() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut cur = libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit64/setrlimit64 on valid rlimit64 values.
        unsafe {
            if libc::getrlimit64(libc::RLIMIT_CORE, &mut cur) == 0 && cur.rlim_max == 0 {
                cur.rlim_max = 1;
                libc::setrlimit64(libc::RLIMIT_CORE, &cur);
            }
        }
    });
}

/// The rlimits of a run. With cgroups, memory and pids are the cgroup's job; in degraded mode
/// `RLIMIT_AS` and `RLIMIT_NPROC` stand in (each slot has its own host uid, so `RLIMIT_NPROC`
/// counts only the box's processes).
pub fn for_limits(l: &Limits, degraded: bool) -> Vec<(u32, libc::rlimit64)> {
    let lim = |cur: u64, max: u64| libc::rlimit64 {
        rlim_cur: cur,
        rlim_max: max,
    };
    // CPU time: the supervisor enforces the exact limit over the whole cgroup; the rlimit is a
    // per-process backstop one second later (SIGXCPU), then SIGKILL a second after that.
    let cpu = l.cpu_time_s.ceil() as u64 + 1;
    allow_no_core();
    let mut v = vec![
        (libc::RLIMIT_CPU, lim(cpu, cpu + 1)),
        (libc::RLIMIT_FSIZE, lim(l.max_file_bytes, l.max_file_bytes)),
        (libc::RLIMIT_NOFILE, lim(l.max_open_files, l.max_open_files)),
        (libc::RLIMIT_CORE, NO_CORE),
        (libc::RLIMIT_MEMLOCK, lim(64 << 10, 64 << 10)),
        (libc::RLIMIT_MSGQUEUE, lim(1 << 20, 1 << 20)),
    ];
    if degraded {
        v.push((libc::RLIMIT_AS, lim(l.memory_bytes, l.memory_bytes)));
        v.push((libc::RLIMIT_NPROC, lim(l.max_pids, l.max_pids)));
    }
    // Never ask for more than the host process has: raising a hard limit needs
    // CAP_SYS_RESOURCE in the initial user namespace, which the box does not have.
    v.into_iter()
        .map(|(r, mut l)| {
            let mut cur = libc::rlimit64 {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit64 writes a valid rlimit64.
            if unsafe { libc::getrlimit64(r, &mut cur) } == 0 {
                l.rlim_max = l.rlim_max.min(cur.rlim_max);
                l.rlim_cur = l.rlim_cur.min(l.rlim_max);
            }
            #[allow(clippy::unnecessary_cast)] // the resource type is u32 on glibc, c_int elsewhere
            (r as u32, l)
        })
        .collect()
}

/// This process's `RLIMIT_NOFILE`, if the kernel tells.
fn nofile() -> Option<libc::rlimit64> {
    let mut cur = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit64 writes a valid rlimit64 into `cur`.
    (unsafe { libc::getrlimit64(libc::RLIMIT_NOFILE, &mut cur) } == 0).then_some(cur)
}

/// File descriptors the supervisor holds per slot at the most, with room to spare: measured
/// about 24 for an idle slot with a warm interpreter (14, plus the channels it has made for
/// its next run) and 23 during a run (pipes, the run's tmpfs, the seccomp listener, pidfds,
/// cgroup files).
pub const FDS_PER_SLOT: u64 = 32;

/// Slots of the sandboxes alive in this process: the descriptors they may hold at once.
static SLOTS_IN_PROCESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A sandbox's share of the room made in `RLIMIT_NOFILE` (see [`make_room_for_slots`]); its
/// slots stop counting when it is dropped. The limit itself is never lowered again.
#[derive(Debug)]
pub struct FdRoom(u64);

impl Drop for FdRoom {
    fn drop(&mut self) {
        SLOTS_IN_PROCESS.fetch_sub(self.0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Makes room in this process's `RLIMIT_NOFILE` for `slots` more slots (on top of the
/// descriptors open now and those of the other live sandboxes), raising the soft limit, and
/// the hard one where it is lower and we may (the sandbox runs as root). A common default soft
/// limit of 1,024 is reached by about 45 busy slots, and the default concurrency is 8 per
/// core: on a 16-core host, runs would fail with `EMFILE` under load. Never lowers a limit;
/// best effort (a container may forbid raising the hard limit). The boxes get their own limit
/// (`Limits::max_open_files`), whatever the host's. Hold the returned guard as long as the
/// slots live.
pub fn make_room_for_slots(slots: usize) -> FdRoom {
    use std::sync::atomic::Ordering;
    let room = FdRoom(slots as u64);
    let total = SLOTS_IN_PROCESS.fetch_add(room.0, Ordering::Relaxed) + room.0;
    let open = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(256);
    raise_nofile(open + total * FDS_PER_SLOT + 64);
    room
}

/// Raises `RLIMIT_NOFILE` to at least `need` where possible.
fn raise_nofile(need: u64) {
    let Some(cur) = nofile() else {
        return;
    };
    if cur.rlim_cur >= need {
        return;
    }
    if cur.rlim_max < need {
        // The kernel's ceiling for RLIMIT_NOFILE.
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(1 << 20);
        let both = libc::rlimit64 {
            rlim_cur: need.min(nr_open),
            rlim_max: need.min(nr_open),
        };
        // SAFETY: setrlimit64 reads a valid rlimit64; raising the hard limit needs
        // CAP_SYS_RESOURCE and fails harmlessly without it.
        if unsafe { libc::setrlimit64(libc::RLIMIT_NOFILE, &both) } == 0 {
            return;
        }
    }
    let soft = libc::rlimit64 {
        rlim_cur: need.min(cur.rlim_max),
        rlim_max: cur.rlim_max,
    };
    // SAFETY: setrlimit64 reads a valid rlimit64; a soft limit up to the hard one is always
    // allowed (and a failure leaves the limit as it was).
    unsafe { libc::setrlimit64(libc::RLIMIT_NOFILE, &soft) };
}

/// Adds what to do to an infrastructure error that ran out of file descriptors.
pub fn explain_fd_exhaustion(error: String) -> String {
    let ours = error.contains("(os error 24)");
    if !ours && !error.contains("(os error 23)") {
        return error;
    }
    let cur = nofile().unwrap_or(libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    });
    if ours {
        format!(
            "{error}: this process has run out of file descriptors (RLIMIT_NOFILE {} soft, {} \
             hard; each busy slot holds up to {FDS_PER_SLOT}): raise the limit (ulimit -n) or \
             lower max_concurrency",
            cur.rlim_cur, cur.rlim_max
        )
    } else {
        format!("{error}: the host has run out of open files (fs.file-max)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_get_a_core_limit_of_exactly_one_byte() {
        let v = for_limits(&Limits::default(), false);
        #[allow(clippy::unnecessary_cast)] // u32 on glibc, c_int elsewhere
        let core = v
            .iter()
            .find(|(r, _)| *r == libc::RLIMIT_CORE as u32)
            .expect("RLIMIT_CORE is set");
        assert_eq!((core.1.rlim_cur, core.1.rlim_max), (1, 1));
    }

    #[test]
    fn fd_exhaustion_is_explained_and_other_errors_are_left_alone() {
        let e = explain_fd_exhaustion("pipe: Too many open files (os error 24)".into());
        assert!(e.starts_with("pipe: Too many open files (os error 24): this process"));
        assert!(
            e.contains("RLIMIT_NOFILE") && e.contains("max_concurrency"),
            "{e}"
        );
        let e = explain_fd_exhaustion("pipe: Too many open files in system (os error 23)".into());
        assert!(e.ends_with("(fs.file-max)"), "{e}");
        let other = "fork: Resource temporarily unavailable (os error 11)".to_string();
        assert_eq!(explain_fd_exhaustion(other.clone()), other);
    }
}
