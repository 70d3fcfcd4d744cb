//! Creating the box: one flat, ordered containment pipeline.
//!
//! The host is multi-threaded, so the box is created the way `posix_spawn` creates a process:
//! `clone(CLONE_VM | CLONE_NEW*)` onto a stack allocated in advance ([`ChildStack`],
//! [`clone_child`]). Until `execve` the child shares the parent's memory, so it does only
//! async-signal-safe work: it reads a [`ChildPlan`] built completely before the clone, issues
//! raw system calls through [`crate::sys`], and reports a failure as a fixed 8-byte record
//! ([`Step`], errno) on a close-on-exec pipe. It never allocates, never takes a lock, never
//! panics.
//!
//! Why, and the pipeline step by step, are in `docs/design/spawn.md`.
//!
//! Layout: `status` ([`Step`] and the status record), `child` (pid 1: mounts, namespaces,
//! stdio, rlimits, its identity, then the init), `program` (pid 2: the box user, working
//! directory, signals, seccomp, `execve`), `identity` (capabilities, the dumpable flag),
//! `stack` ([`ChildStack`], [`clone_child`], [`ptr_array`]), `tests`.

use std::ffi::{c_char, c_void, CStr, CString};
use std::os::fd::RawFd;

use crate::mounts::ChildPaths;
use crate::seccomp::Filter;

mod child;
mod identity;
mod program;
mod stack;
mod status;
#[cfg(test)]
mod tests;

pub(crate) use child::DEVPTS_OPTIONS;
pub(crate) use program::KernelSigaction;
pub use stack::{clone_child, ptr_array, ChildStack};
pub use status::Step;

/// Everything the child needs, built before the clone. Raw pointers point into `CString`s and
/// vectors owned by the plan's owner, which outlives the child's use of them (the parent waits
/// for `execve` or for the child's exit before dropping them).
pub struct ChildPlan<'a> {
    pub paths: &'a ChildPaths,
    pub run_mount_fd: RawFd,
    pub sync_read: RawFd,
    pub status_write: RawFd,
    pub listener_sock: RawFd,
    pub stdin_fd: RawFd,
    pub stdout_fd: RawFd,
    pub stderr_fd: RawFd,
    pub rlimits: &'a [(u32, libc::rlimit64)],
    pub cap_last: u32,
    pub box_id: u32,
    pub hostname: &'a [u8],
    pub cwd: &'a CString,
    pub exec_paths: &'a [CString],
    pub argv: &'a [*const c_char],
    pub envp: &'a [*const c_char],
    pub filter: &'a Filter,
    /// `-1` for an ordinary run. Otherwise the box is a warm interpreter: this fd becomes its
    /// fd 3 (its control socket), it stays root of its user namespace with its capabilities,
    /// gets no seccomp filter, and its `/proc` stays fully visible (so that its children can
    /// mount their own).
    pub warm_control: RawFd,
    /// `-1`, or a detached mount to attach at `/work` instead of the run tmpfs's `work/`.
    pub work_mount_fd: RawFd,
    /// Top of the second stack, for the program's own process (pid 2).
    pub stack2_top: *mut c_void,
    /// `/.agentrl/init`.
    pub init_path: &'a CStr,
    /// Whether the host process was dumpable: until `execve` the child shares its memory, and
    /// every uid change clears that (memory-wide) flag, so each one restores it.
    pub host_dumpable: bool,
    /// Mount a cgroup2 file system read-only at `/sys/fs/cgroup` once the box's cgroup
    /// namespace exists (cgroup v2): the box's own cgroup as the whole tree, as a container
    /// sees its own.
    pub mount_cgroup2: bool,
}
