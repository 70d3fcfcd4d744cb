//! Where the base goes on v2 without an explicit parent, including the move of our cgroup's
//! processes into [`HOST_LEAF`].

use std::ffi::CString;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::detect::{has_processes, own_cgroup, read_mountinfo, read_self_cgroup, resolve_own};
use super::fake::fake_populate;
use super::files::{errno, is_cgroupfs, parse_pids, read_path, write_path};
use super::{CgroupError, Version, DEFAULT_ROOT, HOST_LEAF};

/// Where the base goes on v2 when no parent is given (see `docs/design/cgroups.md`).
#[derive(Debug, PartialEq)]
pub(super) enum Placement {
    /// In this cgroup (our own, emptied into [`HOST_LEAF`] where needed, or the true root).
    Here(PathBuf),
    /// Our own cgroup `own` holds processes we may not move: its nearest ancestor `dir`
    /// without processes.
    Ancestor { own: PathBuf, dir: PathBuf },
}

/// Whether `dir` is the true root of the hierarchy (exempt from the "no internal processes"
/// rule). The root of a cgroup namespace, as a container sees its own cgroup, is not: only
/// non-root cgroups have a `cgroup.type` file.
fn is_true_root(root: &Path, dir: &Path) -> bool {
    dir == root && !dir.join("cgroup.type").exists()
}

/// Whether the cgroup `dir` was delegated to its processes: systemd (251+) marks the cgroup
/// of a unit with `Delegate=yes` with the extended attribute `trusted.delegate` (or
/// `user.delegate` for a user manager) set to `1`.
pub(super) fn is_delegated(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    [c"trusted.delegate", c"user.delegate"].iter().any(|name| {
        let mut v = [0u8; 8];
        // SAFETY: `path` and `name` are NUL-terminated; `v` is a writable buffer of the
        // length passed.
        let n =
            unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        n > 0 && v[..n as usize].starts_with(b"1")
    })
}

/// Moves every process of v2 cgroup `dir` into its leaf child [`HOST_LEAF`] (made if missing),
/// so that `dir` may enable controllers for new children of its own. The processes stay
/// inside `dir`'s subtree, so every limit that applied to them still does. Retries while
/// processes keep arriving (forks during the move), within a bound.
fn evacuate(dir: &Path, fake: bool) -> Result<(), CgroupError> {
    let leaf = dir.join(HOST_LEAF);
    match fs::create_dir(&leaf) {
        Ok(()) if fake => fake_populate(&leaf, Version::V2).map_err(|e| {
            CgroupError::io(format!("cannot populate fake cgroup {}", leaf.display()), e)
        })?,
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(CgroupError::io(
                format!(
                    "cannot create cgroup {} to move this process's cgroup's processes into",
                    leaf.display()
                ),
                e,
            ))
        }
    }
    let procs = leaf.join("cgroup.procs");
    for _ in 0..100 {
        let pids = parse_pids(read_path(&dir.join("cgroup.procs"))?.as_bytes());
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            match write_path(&procs, &pid.to_string(), false) {
                Ok(()) => {}
                Err(e) if errno(&e) == libc::ESRCH => {} // it exited meanwhile
                Err(e) => {
                    return Err(CgroupError::io(
                        format!("cannot move process {pid} into {}", procs.display()),
                        e,
                    ))
                }
            }
        }
        if fake {
            // The kernel moves them; a fake tree only records the writes.
            write_path(&dir.join("cgroup.procs"), "", true)
                .map_err(|e| CgroupError::io("cannot empty a fake cgroup.procs", e))?;
        }
    }
    Err(CgroupError::msg(format!(
        "processes keep appearing in {} while moving them into {}",
        dir.display(),
        leaf.display()
    )))
}

/// Where the base goes on v2 without an explicit parent. Our own cgroup `own` keeps the
/// sandbox inside every limit that applies to us, but cgroup v2's "no internal processes"
/// rule lets a cgroup enable controllers for children only while it has no processes:
///
/// 1. `own` without processes (e.g. our [`HOST_LEAF`]'s parent, once emptied), or the true
///    root: `own`.
/// 2. `own` is ours to rearrange: a cgroup namespace's root (a container's own cgroup), a
///    delegated cgroup (systemd `Delegate=yes`), or one whose only process is this one (a
///    service's main process): its processes move into `own/agentrl-host`, then `own`.
/// 3. Otherwise (other programs' processes in a cgroup not delegated to us, as a login
///    session's scope): the nearest ancestor without processes, which keeps the sandbox
///    inside the ancestors' limits (not `own`'s).
fn default_v2_parent(
    root: &Path,
    own: PathBuf,
    me: libc::pid_t,
    fake: bool,
) -> Result<Placement, CgroupError> {
    // A process of ours moved into the leaf earlier: the cgroup to use is its parent.
    let own = match (own.file_name(), own.parent()) {
        (Some(n), Some(p)) if own != root && n == HOST_LEAF => p.to_path_buf(),
        _ => own,
    };
    if is_true_root(root, &own) || !has_processes(&own)? {
        return Ok(Placement::Here(own));
    }
    let pids = parse_pids(read_path(&own.join("cgroup.procs"))?.as_bytes());
    if own == root || is_delegated(&own) || pids == [me] {
        evacuate(&own, fake)?;
        return Ok(Placement::Here(own));
    }
    let mut dir = own.clone();
    while dir != root && dir.pop() {
        if is_true_root(root, &dir) || !has_processes(&dir)? {
            return Ok(Placement::Ancestor { own, dir });
        }
        if dir == root {
            // A container's root (a cgroup namespace) with processes: the container is ours.
            evacuate(&dir, fake)?;
            return Ok(Placement::Ancestor { own, dir });
        }
    }
    Err(CgroupError::msg(format!(
        "cgroup {} is not below the cgroup v2 mount {}",
        own.display(),
        root.display()
    )))
}

/// This process's own v2 cgroup (from the text of `/proc/self/cgroup`) and where the base goes
/// without an explicit parent ([`default_v2_parent`]).
pub(super) fn own_v2_placement(
    root: &Path,
    self_cgroup: &str,
    mountinfo: &dyn Fn() -> String,
    fake: bool,
) -> Result<Placement, CgroupError> {
    let rel = own_cgroup(self_cgroup, None).ok_or_else(|| {
        CgroupError::msg(
            "/proc/self/cgroup has no cgroup v2 entry ('0::<path>'); is this process in the \
             unified hierarchy?",
        )
    })?;
    let own = resolve_own(root, rel, mountinfo);
    default_v2_parent(root, own, std::process::id() as libc::pid_t, fake)
}

/// On a cgroup v2 host, the cgroup in which a sandbox's base goes when no parent is given (see
/// `docs/design/cgroups.md`; this may move our cgroup's processes into [`HOST_LEAF`]). `None`
/// on a v1 or hybrid host. For other managers of cgroups (the nsjail backend), so that every
/// backend places its cgroups alike.
pub fn default_v2_parent_dir() -> Result<Option<PathBuf>, CgroupError> {
    let root = Path::new(DEFAULT_ROOT);
    if !root.join("cgroup.controllers").is_file() {
        return Ok(None);
    }
    let placement = own_v2_placement(
        root,
        &read_self_cgroup()?,
        &read_mountinfo,
        !is_cgroupfs(root),
    )?;
    Ok(Some(match placement {
        Placement::Here(d) | Placement::Ancestor { dir: d, .. } => d,
    }))
}
