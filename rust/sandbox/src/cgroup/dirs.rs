//! Removal of cgroup directories, and the guards that remove them on drop: the shared base
//! ([`BaseDirs`]) and directories made so far ([`DirGuard`]).

use std::fs;
use std::io::{self, ErrorKind};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::detect::has_processes;
use super::files::{parse_pids, sigkill};
use super::{KILL_TIMEOUT, RMDIR_TIMEOUT};
use crate::retry;

/// Removes one cgroup directory, retrying while the kernel answers `EBUSY`. A missing directory
/// counts as removed.
pub(super) fn remove_cgroup_dir(path: &Path, fake: bool) -> io::Result<()> {
    if fake {
        if let Ok(entries) = fs::read_dir(path) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    match retry::while_busy(RMDIR_TIMEOUT, || fs::remove_dir(path)) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Whether `dir` or a cgroup below it holds a process (or cannot be read).
pub(super) fn tree_has_processes(dir: &Path) -> bool {
    if has_processes(dir).unwrap_or(true) {
        return true;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return true;
    };
    entries
        .flatten()
        .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && tree_has_processes(&e.path()))
}

/// Removes `dir` and every cgroup below it, depth first. With `kill`, processes found in each
/// cgroup are SIGKILLed first (never in fake mode). Returns whether `dir` is gone.
pub(super) fn remove_tree(dir: &Path, fake: bool, kill: bool) -> bool {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path(), fake, kill);
            }
        }
    }
    if kill && !fake {
        let deadline = Instant::now() + KILL_TIMEOUT;
        let mut pause = retry::FIRST_PAUSE;
        loop {
            let me = std::process::id() as libc::pid_t;
            let mut pids = fs::read(dir.join("cgroup.procs"))
                .map(|d| parse_pids(&d))
                .unwrap_or_default();
            pids.retain(|&p| p != me);
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            pids.into_iter().for_each(sigkill);
            retry::backoff(&mut pause);
        }
    }
    remove_cgroup_dir(dir, fake).is_ok()
}

/// The private base cgroup directories (one per hierarchy). Shared by the
/// [`Manager`](super::Manager) and its slots, so that it is removed only after every slot is
/// gone, whatever the drop order.
#[derive(Debug)]
pub(super) struct BaseDirs {
    pub(super) dirs: Vec<PathBuf>,
    pub(super) fake: bool,
    /// The `flock`s that mark the base as owned (released after the removal in `drop`).
    pub(super) _locks: Vec<OwnedFd>,
}

impl Drop for BaseDirs {
    fn drop(&mut self) {
        for d in &self.dirs {
            if remove_cgroup_dir(d, self.fake).is_err() {
                // Leaked slots (e.g. `mem::forget`): kill and remove whatever is below.
                remove_tree(d, self.fake, true);
            }
        }
    }
}

/// Removes directories created so far unless disarmed.
pub(super) struct DirGuard {
    pub(super) dirs: Vec<PathBuf>,
    pub(super) fake: bool,
}

impl DirGuard {
    pub(super) fn disarm(mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.dirs)
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            let _ = remove_cgroup_dir(d, self.fake);
        }
    }
}
