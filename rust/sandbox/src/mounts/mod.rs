//! The box's file system: what it sees, and how that view is built.
//!
//! Built in two stages so that a run costs as little as possible: **per slot, once**
//! ([`Template::build`], on the slot's own thread, in its private mount namespace) a small
//! read-only tmpfs becomes the future root, with the directory skeleton, `/etc` (generated
//! files and the host's allowlisted configuration, [`ETC_ALLOW`]), `/dev` placeholders,
//! `/sys/fs/cgroup` ([`CgroupView`]) and read-only binds of the system directories and the
//! caller's binds; **per run** a fresh size-limited tmpfs ([`RunFs`]) holds `/work`, `/tmp` and
//! `/dev/shm`, and the child moves it into a copy of the slot's namespace, mounts its own
//! `/proc` and `/dev/pts` and `pivot_root`s into the template ([`ChildPaths`]).
//!
//! The design, step by step, is in `docs/design/mounts.md`.
//!
//! Layout: `layout` ([`Layout`]: what the root is made of), `etc` (the box's `/etc`),
//! `cgroup_view` ([`CgroupView`]), `template` ([`Template`]), `runfs` ([`RunFs`],
//! [`ChildPaths`], [`collect_at`]), `sys` (mount API system calls), `fs` (file helpers at
//! directory fds), `tests`.

mod cgroup_view;
mod etc;
mod fs;
mod layout;
mod runfs;
mod sys;
mod template;
#[cfg(test)]
mod tests;

pub use cgroup_view::CgroupView;
pub use etc::ETC_ALLOW;
pub use fs::describe;
pub(crate) use fs::{mkdirat, open_dir_at, write_all, write_file_at};
pub use layout::Layout;
pub use runfs::{collect_at, ChildPaths, RunFs};
pub(crate) use sys::{new_tmpfs, private_mount_namespace};
pub use template::Template;

/// Inside uid and gid of the box's user.
pub const BOX_ID: u32 = 1000;
