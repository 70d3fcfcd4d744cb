//! Per-process resource limits set in the child before `execve`.

use crate::limits::Limits;

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
    let mut v = vec![
        (libc::RLIMIT_CPU, lim(cpu, cpu + 1)),
        (libc::RLIMIT_FSIZE, lim(l.max_file_bytes, l.max_file_bytes)),
        (libc::RLIMIT_NOFILE, lim(l.max_open_files, l.max_open_files)),
        (libc::RLIMIT_CORE, lim(0, 0)),
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
