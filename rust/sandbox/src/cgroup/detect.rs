//! Discovery: this process's cgroup (from `/proc/self/cgroup` and `/proc/self/mountinfo`),
//! the v1 hierarchies below the root, and which kernel features are to be treated as absent
//! ([`hidden`]).

use std::fs;
use std::path::{Path, PathBuf};

use super::files::read_path;
use super::CgroupError;

/// This process's cgroup path in the unified hierarchy (`ctrl == None`, line `0::<path>`) or in
/// the v1 hierarchy that carries `ctrl`, from the text of `/proc/self/cgroup`.
pub(super) fn own_cgroup<'a>(self_cgroup: &'a str, ctrl: Option<&str>) -> Option<&'a str> {
    self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match ctrl {
            None => id == "0" && ctrls.is_empty(),
            Some(c) => ctrls.split(',').any(|x| x == c),
        };
        hit.then_some(path)
    })
}

/// The root (4th field) of the mount at `mount_point`, from the text of `/proc/self/mountinfo`.
pub(super) fn mount_root_of(mountinfo: &str, mount_point: &Path) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            (f.len() > 4 && Path::new(f[4]) == mount_point).then(|| PathBuf::from(f[3]))
        })
        .next_back()
}

/// Resolves a cgroup path `rel` (as in `/proc/self/cgroup`) to a directory under `mount`.
pub(super) fn resolve_own(mount: &Path, rel: &str, mountinfo: &dyn Fn() -> String) -> PathBuf {
    let direct = mount.join(rel.trim_start_matches('/'));
    if direct.is_dir() {
        return direct;
    }
    let canon = fs::canonicalize(mount).unwrap_or_else(|_| mount.to_path_buf());
    if let Some(mroot) = mount_root_of(&mountinfo(), &canon) {
        if let Ok(rest) = Path::new(rel).strip_prefix(&mroot) {
            let p = mount.join(rest);
            if p.is_dir() {
                return p;
            }
        }
    }
    mount.to_path_buf()
}

/// Finds the v1 hierarchy carrying `ctrl` below `root`: `root/<ctrl>` or a co-mounted
/// directory such as `root/cpu,cpuacct`.
pub(super) fn find_v1_mount(root: &Path, ctrl: &str) -> Option<PathBuf> {
    let direct = root.join(ctrl);
    if direct.join("cgroup.procs").is_file() {
        return Some(direct);
    }
    for e in fs::read_dir(root).ok()?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.split(',').any(|c| c == ctrl) && e.path().join("cgroup.procs").is_file() {
            return Some(e.path());
        }
    }
    None
}

pub(super) fn has_processes(dir: &Path) -> Result<bool, CgroupError> {
    Ok(read_path(&dir.join("cgroup.procs"))?
        .split_whitespace()
        .next()
        .is_some())
}

pub(super) fn read_self_cgroup() -> Result<String, CgroupError> {
    fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| CgroupError::io("cannot read /proc/self/cgroup", e))
}

pub(super) fn read_mountinfo() -> String {
    fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
}

/// The environment variable that makes the manager act as on an older kernel (see
/// [`hidden`]).
pub const HIDE_ENV: &str = "AGENTRL_CGROUP_HIDE";

/// Whether the kernel feature `name` is to be treated as absent: `AGENTRL_CGROUP_HIDE` is a
/// comma-separated list of `memory.peak` (Linux 5.14-5.18: no peak counter, per-run figures
/// sampled), `memory.peak.reset` (5.19-6.11: a lifetime counter only) and `cgroup.kill`
/// (5.12-5.13: killing by signals to `cgroup.procs`). It lets the fallbacks for kernels the
/// test matrix cannot boot run on one it can (`.ci/guest-matrix`); a feature that is absent
/// stays absent. Read once per process.
pub fn hidden(name: &str) -> bool {
    static HIDDEN: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    HIDDEN
        .get_or_init(|| {
            std::env::var(HIDE_ENV)
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .iter()
        .any(|h| h == name)
}
