//! Removal of base cgroups left behind by processes that died without removing them.

use std::fs;
use std::time::Duration;

use super::dirs::{remove_tree, tree_has_processes};
use super::files::{pid_alive, try_lock_dir};
use super::{Manager, BASE_PREFIX, STALE_GRACE};

impl Manager {
    /// Removes base cgroups `agentrl-<pid>-<n>` (with the slots below them) left next to ours
    /// by processes that died without removing them: the owner pid is gone from our pid
    /// namespace, nobody holds the base's lock (a live owner in another pid namespace does),
    /// and it is older than [`STALE_GRACE`]. Cgroups that still contain processes are left
    /// alone (nothing is killed). Returns how many base directories were removed. Called once
    /// when a manager is created.
    pub fn remove_stale(&self) -> usize {
        self.remove_stale_older_than(STALE_GRACE)
    }

    pub(super) fn remove_stale_older_than(&self, grace: Duration) -> usize {
        let me = std::process::id();
        let mut removed = 0;
        for parent in &self.parents {
            let Ok(entries) = fs::read_dir(parent) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix(BASE_PREFIX))
                    .and_then(|n| n.split_once('-'))
                    .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
                else {
                    continue;
                };
                if pid as u32 == me || pid_alive(pid) {
                    continue;
                }
                let Ok(meta) = e.metadata() else { continue };
                let young = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| age < grace);
                if !meta.is_dir() || young {
                    continue;
                }
                // Held while removing: a stale base is ours alone, and an owner still alive
                // elsewhere keeps it.
                let Ok(Some(_lock)) = try_lock_dir(&e.path()) else {
                    continue;
                };
                if !tree_has_processes(&e.path()) && remove_tree(&e.path(), self.fake, false) {
                    removed += 1;
                }
            }
        }
        removed
    }
}
