//! Network isolation.
//!
//! Each slot thread unshares its own network namespace once, when the slot is created, and
//! every box the slot spawns inherits it. Creating a network namespace per run would take the
//! kernel's global `net_mutex` (and its teardown is deferred to a single work queue), so
//! namespaces are made once and reused; because a slot runs one box at a time, two boxes alive
//! at once never share a namespace, and so never reach each other through an abstract unix
//! socket or the loopback interface. The namespace has only `lo`, brought up (127.0.0.1 and
//! ::1) so that programs that talk to themselves over it work: the seccomp policy allows IP
//! sockets without `network`, as they reach nothing else (see [`crate::seccomp`]).
//!
//! Sequential boxes of a slot do share the namespace, so nothing of one run's sockets may stay
//! in it: listening and connected sockets close with their processes, but a TCP connection's
//! active closer would leave a `TIME_WAIT` entry for 60 seconds, which the next run would see
//! in `/proc/net/tcp` and which would make its `bind` of the same port fail with `EADDRINUSE`.
//! So the namespace keeps no `TIME_WAIT` entries (`net.ipv4.tcp_max_tw_buckets = 0`, a
//! per-namespace setting: a closed connection goes straight to `CLOSED`; over loopback there
//! are no stray segments for `TIME_WAIT` to absorb).

use std::io;

/// Gives the calling thread a new, empty network namespace with `lo` up and no `TIME_WAIT`.
pub fn unshare_thread_netns() -> io::Result<()> {
    // SAFETY: unshare(CLONE_NEWNET) affects only the calling thread's namespace set.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    loopback_up()?;
    no_time_wait()
}

/// Sets `net.ipv4.tcp_max_tw_buckets` to 0 in the calling thread's network namespace (`/proc/sys/net`
/// shows the namespace of the thread that opens it). A kernel without the per-namespace
/// setting (before 4.15) keeps the host's value: not an error.
fn no_time_wait() -> io::Result<()> {
    match std::fs::write("/proc/sys/net/ipv4/tcp_max_tw_buckets", b"0") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("setting tcp_max_tw_buckets in the slot's network namespace: {e}"),
            )
        }),
    }
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket creation; the fd is closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write req, which is a valid ifreq.
    let r = unsafe {
        if libc::ioctl(s, libc::SIOCGIFFLAGS, &mut req) < 0 {
            -1
        } else {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            libc::ioctl(s, libc::SIOCSIFFLAGS, &req)
        }
    };
    let err = io::Error::last_os_error();
    // SAFETY: closing our own socket.
    unsafe { libc::close(s) };
    if r < 0 {
        return Err(err);
    }
    Ok(())
}
