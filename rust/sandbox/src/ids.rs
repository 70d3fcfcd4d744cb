//! Host uids and gids for boxes, unique across every agentrl process on the host.
//!
//! Each slot (and each session) needs host ids that no other live box uses: per-user kernel
//! limits (inotify instances, user namespaces, message queues...) are counted per host uid,
//! so two boxes sharing one could starve each other. Ids are claimed with `flock` on one file
//! per id block in a directory only this user can write; the lock lives as long as the
//! claiming slot or session and is released by the kernel if the process dies, so a crashed
//! process never leaks ids.
//!
//! Which ids: in the host's own user namespace, a fixed range far above any account
//! ([`crate::config::DEFAULT_HOST_ID_BASE`]). In a user namespace of its own (rootless mode,
//! a container with user-namespace remapping) only the ids its `uid_map` and `gid_map` map
//! exist: the boxes then take the upper half of the largest range mapped in both (the
//! subordinate ids of `/etc/subuid`), away from the low ids the namespace's own files use,
//! and the claims live in a directory named after where that range starts on the host, so
//! that two namespaces of one user that map the same ids share their claims.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

/// Slot id blocks (two ids each) in the host's own user namespace.
const HOST_SLOT_BLOCKS: u32 = 0x8000;
/// Sessions (one id each) in the host's own user namespace.
const HOST_SESSIONS: u32 = 0x10000;
/// The fewest ids a user namespace must map besides its root for boxes to run in it.
const MIN_IDS: u32 = 16;
/// The nsjail backend's ids in the host's own user namespace (after the native backend's).
const NSJAIL_HOST_BASE: u32 = 0x5B00_0000;
/// How many.
const NSJAIL_HOST_SPAN: u32 = 1 << 16;

/// A claimed id block, released when dropped.
#[derive(Debug)]
pub struct Claim {
    /// Index of the block within its range.
    pub index: u32,
    _lock: OwnedFd,
}

/// The ids the boxes of this process may use, and where claims on them are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdSpace {
    /// First id of the slots' blocks (two ids per slot), in this process's user namespace.
    pub base: u32,
    /// Slot blocks available.
    pub slot_blocks: u32,
    /// Sessions' ids start this far above `base`, after every slot block.
    pub session_offset: u32,
    /// Sessions available.
    pub sessions: u32,
    /// The ids of the nsjail backend's boxes (one per run): `(first, count)`, apart from the
    /// slots' and the sessions'.
    pub nsjail: (u32, u32),
    /// Directories to keep the claims in, the first that can be made wins.
    dirs: Vec<PathBuf>,
}

/// One line of a `uid_map`/`gid_map`: `(inside, outside, count)`.
type Extent = (u32, u32, u32);

fn parse_map(text: &str) -> Vec<Extent> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace().map(|v| v.parse::<u32>().ok());
            Some((it.next()??, it.next()??, it.next()??))
        })
        .collect()
}

/// Whether `[start, start + len)` is mapped (inside ids) by `map`.
fn covers(map: &[Extent], start: u32, len: u32) -> bool {
    let end = u64::from(start) + u64::from(len);
    let mut at = u64::from(start);
    // Extents do not overlap; walk them in order of their inside start.
    let mut sorted: Vec<_> = map.to_vec();
    sorted.sort();
    for (inside, _, count) in sorted {
        let (lo, hi) = (u64::from(inside), u64::from(inside) + u64::from(count));
        if lo <= at && at < hi {
            at = hi;
        }
        if at >= end {
            return true;
        }
    }
    at >= end
}

/// The host's view of inside id `id` under `map`.
fn outside(map: &[Extent], id: u32) -> Option<u32> {
    map.iter().find_map(|&(inside, out, count)| {
        (inside <= id && u64::from(id) < u64::from(inside) + u64::from(count))
            .then(|| out + (id - inside))
    })
}

/// The largest run of inside ids mapped by both maps, leaving out id 0.
fn largest_common(uids: &[Extent], gids: &[Extent]) -> Option<(u32, u32)> {
    let mut best: Option<(u32, u32)> = None;
    for &(ui, _, uc) in uids {
        for &(gi, _, gc) in gids {
            let lo = u64::from(ui.max(gi)).max(1);
            let hi = (u64::from(ui) + u64::from(uc)).min(u64::from(gi) + u64::from(gc));
            if hi > lo {
                let len = (hi - lo).min(u64::from(u32::MAX)) as u32;
                if best.is_none_or(|(_, l)| len > l) {
                    best = Some((lo as u32, len));
                }
            }
        }
    }
    best
}

impl IdSpace {
    /// The id space for a process whose `uid_map` and `gid_map` read as given, with
    /// `default_base` as the first id in the host's own user namespace.
    pub fn from_maps(uid_map: &str, gid_map: &str, default_base: u32) -> io::Result<IdSpace> {
        let (uids, gids) = (parse_map(uid_map), parse_map(gid_map));
        let host_need = 2 * HOST_SLOT_BLOCKS + HOST_SESSIONS;
        let initial = uids == [(0, 0, u32::MAX)] && gids == [(0, 0, u32::MAX)];
        if initial
            || (covers(&uids, default_base, host_need) && covers(&gids, default_base, host_need))
        {
            let key = if initial {
                String::new()
            } else {
                format!("-{}", outside(&uids, default_base).unwrap_or(default_base))
            };
            return Ok(IdSpace {
                base: default_base,
                slot_blocks: HOST_SLOT_BLOCKS,
                session_offset: 2 * HOST_SLOT_BLOCKS,
                sessions: HOST_SESSIONS,
                nsjail: (NSJAIL_HOST_BASE, NSJAIL_HOST_SPAN),
                dirs: vec![
                    PathBuf::from(format!("/run/agentrl/ids{key}")),
                    PathBuf::from(format!("/dev/shm/agentrl-ids{key}")),
                ],
            });
        }
        let (start, len) = largest_common(&uids, &gids)
            .filter(|&(_, len)| len >= 2 * MIN_IDS)
            .ok_or_else(|| {
                io::Error::other(format!(
                    "this user namespace maps too few ids for boxes (uid_map: {}; gid_map: {}): \
                     each box runs as ids of its own, so the namespace needs a range of \
                     subordinate ids besides its root (at least {}; /etc/subuid and \
                     /etc/subgid, as `agentrl rootless` maps them)",
                    uid_map.trim().replace('\n', ", "),
                    gid_map.trim().replace('\n', ", "),
                    2 * MIN_IDS
                ))
            })?;
        // The upper half: the low ids are the ones the namespace's own files use. Of it, half
        // for the slots' blocks, a quarter for sessions, a quarter for the nsjail backend.
        let n = len / 2;
        let base = start + (len - n);
        let slot_blocks = n / 4;
        let sessions = n / 4;
        let key = outside(&uids, base).unwrap_or(base);
        let nsjail_first = base + 2 * slot_blocks + sessions;
        Ok(IdSpace {
            base,
            slot_blocks,
            session_offset: 2 * slot_blocks,
            sessions,
            nsjail: (nsjail_first, base + n - nsjail_first),
            dirs: vec![
                PathBuf::from(format!("/run/agentrl/ids-{key}")),
                PathBuf::from(format!("/dev/shm/agentrl-ids-{key}")),
            ],
        })
    }

    /// The id space of this process (see the module docs).
    pub fn for_this_process(default_base: u32) -> io::Result<IdSpace> {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_else(|_| "0 0 4294967295".into());
        IdSpace::from_maps(
            &read("/proc/self/uid_map"),
            &read("/proc/self/gid_map"),
            default_base,
        )
    }

    fn dir(&self) -> io::Result<PathBuf> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mut last = None;
        for p in &self.dirs {
            match std::fs::create_dir_all(p) {
                Ok(()) => {
                    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
                    // Only a directory of this user's that no one else can write: anyone who
                    // could would hand out (or hold) ids in use.
                    let md = std::fs::symlink_metadata(p)?;
                    // SAFETY: geteuid has no preconditions.
                    let euid = unsafe { libc::geteuid() };
                    if !md.is_dir() || md.uid() != euid || md.mode() & 0o022 != 0 {
                        return Err(io::Error::other(format!(
                            "{} (for the claims on host ids) is not a directory of this \
                             user's that only it can write",
                            p.display()
                        )));
                    }
                    return Ok(p.clone());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no directory for id claims")))
    }

    /// Claims the lowest free block index in `range` (a name such as "slot" or "session"),
    /// below `max`.
    pub fn claim(&self, range: &str, max: u32) -> io::Result<Claim> {
        let dir = self.dir()?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u32 = crate::config::DEFAULT_HOST_ID_BASE;

    #[test]
    fn claims_are_exclusive_and_released() {
        let space = IdSpace::for_this_process(BASE).unwrap();
        let a = space.claim("test-ids", 64).unwrap();
        let b = space.claim("test-ids", 64).unwrap();
        assert_ne!(a.index, b.index);
        let ia = a.index;
        drop(a);
        let c = space.claim("test-ids", 64).unwrap();
        assert!(c.index <= ia.max(b.index));
    }

    #[test]
    fn the_hosts_own_namespace_uses_the_fixed_range() {
        let all = "         0          0 4294967295\n";
        let s = IdSpace::from_maps(all, all, BASE).unwrap();
        assert_eq!((s.base, s.slot_blocks, s.sessions), (BASE, 0x8000, 0x10000));
        assert!(s.base + s.session_offset + s.sessions <= s.nsjail.0);
        assert_eq!(s.dirs[0], PathBuf::from("/run/agentrl/ids"));
    }

    #[test]
    fn a_rootless_namespace_uses_the_upper_half_of_its_subordinate_ids() {
        // `unshare --map-root-user --map-auto` for a user with 100000:65536 in /etc/subuid.
        let map = "         0       1001          1\n         1     100000      65535\n";
        let s = IdSpace::from_maps(map, map, BASE).unwrap();
        assert_eq!(s.base, 1 + 65535 - 32767);
        assert_eq!(s.slot_blocks, 32767 / 4);
        assert_eq!(s.session_offset, 2 * s.slot_blocks);
        // Every id handed out is mapped, and none is the namespace's root.
        let last_session = s.base + s.session_offset + s.sessions - 1;
        assert!(last_session < s.nsjail.0, "{last_session} {:?}", s.nsjail);
        let last = s.nsjail.0 + s.nsjail.1 - 1;
        assert_eq!(last, 65535);
        assert!(s.nsjail.1 >= 8000, "{:?}", s.nsjail);
        assert!(covers(&parse_map(map), s.base, last - s.base + 1));
        // Claims are keyed by where the range starts on the host.
        assert_eq!(
            s.dirs[1],
            PathBuf::from(format!("/dev/shm/agentrl-ids-{}", 100000 + s.base - 1))
        );
    }

    #[test]
    fn a_remapped_container_that_maps_the_fixed_range_keeps_it() {
        let map = "0 100000 65536\n1509949440 200000000 200000\n";
        let s = IdSpace::from_maps(map, map, BASE).unwrap();
        assert_eq!(s.base, BASE);
        assert_eq!(
            s.dirs[0],
            PathBuf::from(format!("/run/agentrl/ids-{}", 200000000))
        );
    }

    #[test]
    fn only_ids_mapped_for_both_users_and_groups_count() {
        let uids = "0 1000 1\n1 100000 65536\n";
        let gids = "0 1000 1\n1 100000 1000\n";
        let s = IdSpace::from_maps(uids, gids, BASE).unwrap();
        assert!(s.nsjail.0 + s.nsjail.1 - 1 <= 1000);
    }

    #[test]
    fn a_single_id_map_is_refused_with_the_way_out() {
        let map = "0 1000 1\n";
        let e = IdSpace::from_maps(map, map, BASE).unwrap_err().to_string();
        assert!(e.contains("maps too few ids"), "{e}");
        assert!(e.contains("/etc/subuid"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
