//! Host uids and gids for boxes, unique across every agentrl process on the host.
//!
//! Each slot (and each session) needs host ids that no other live box uses: per-user kernel
//! limits (inotify instances, user namespaces, message queues...) are counted per host uid,
//! so two boxes sharing one could starve each other. Ids are claimed with `flock` on one file
//! per id block in a root-only directory; the lock lives as long as the claiming slot or
//! session and is released by the kernel if the process dies, so a crashed process never
//! leaks ids.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

/// A claimed id block, released when dropped.
#[derive(Debug)]
pub struct Claim {
    /// Index of the block within its range.
    pub index: u32,
    _lock: OwnedFd,
}

fn dir() -> io::Result<PathBuf> {
    let mut last = None;
    for d in ["/run/agentrl/ids", "/dev/shm/agentrl-ids"] {
        let p = PathBuf::from(d);
        match std::fs::create_dir_all(&p) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700));
                return Ok(p);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no directory for id claims")))
}

/// Claims the lowest free block index in `range` (a name such as "slot" or "session"),
/// below `max`.
pub fn claim(range: &str, max: u32) -> io::Result<Claim> {
    let dir = dir()?;
    for index in 0..max {
        let path = dir.join(format!("{range}-{index}"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        let fd = OwnedFd::from(f);
        // SAFETY: flock on a valid fd; non-blocking.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Claim { index, _lock: fd });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
    }
    Err(io::Error::other(format!(
        "all {max} {range} id blocks are in use on this host"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_exclusive_and_released() {
        let a = claim("test-ids", 64).unwrap();
        let b = claim("test-ids", 64).unwrap();
        assert_ne!(a.index, b.index);
        let ia = a.index;
        drop(a);
        let c = claim("test-ids", 64).unwrap();
        assert!(c.index <= ia.max(b.index));
    }
}
