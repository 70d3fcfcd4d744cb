//! # agentrl-sandbox
//!
//! Runs untrusted programs (model-generated code, mostly) in a box built directly on Linux
//! namespaces, seccomp-bpf, cgroups and rlimits. No Python here: the `agentrl._core` binding
//! crate wraps it.
//!
//! ## What a box is
//! * **Namespaces**: user, mount, pid, ipc, uts, cgroup and network (an empty one per slot,
//!   reused; see [`net`]). `network = true` shares the host network and is unsafe.
//! * **File system**: `pivot_root` into a read-only root of binds of the system runtime and
//!   the interpreters' prefixes; a fresh size-limited tmpfs for `/work`, `/tmp` and
//!   `/dev/shm`; a minimal `/dev`; a fresh `/proc` with `/proc/sys` read-only (see [`mounts`]).
//! * **Identity**: uid/gid 1000 inside, an unprivileged host id of the slot underneath (never
//!   host root), no capabilities, `no_new_privs`, its own session, only fds 0/1/2, an explicit
//!   environment.
//! * **System calls**: a seccomp allowlist compiled before the clone and installed last (see
//!   [`seccomp`]); denied calls are named in the verdict.
//! * **Limits**: wall clock, CPU time, memory and pids through cgroups (v2 or v1, see
//!   [`cgroup`]), output bytes, file size, open files, no core dumps.
//! * **Verdict**: [`ExecResult`], like isolate's meta file.
//!
//! ## Process model
//! The host is multi-threaded, so nothing forks it in the ordinary way. Each slot is a
//! dedicated thread that owns a private mount namespace (with the root template), a network
//! namespace and a cgroup. A run is a `clone(CLONE_VM | CLONE_NEW*)` from that thread onto a
//! pre-allocated stack, as `posix_spawn` does, whose child runs only raw, async-signal-safe
//! system calls over a plan prepared before the clone (see [`spawn`]). The cost does not grow
//! with the size of the host process (no page tables are copied), and it is safe with torch
//! loaded and many threads calling at once. The slot thread takes the box's host uid as its
//! effective uid around the clone, so the box's user namespace is owned by that unprivileged
//! uid (per-user kernel counts are charged to it, never to root).
//!
//! Inside, the first process (pid 1) sets the box up, starts the program as pid 2 (a vfork
//! on a second stack) and then execs the box's init, a tiny static program (see [`init`])
//! that reaps orphans and reports the program's exact wait status: the program is never an
//! init, so its own signals, `abort()` and `SIGXFSZ` behave as anywhere else.
//!
//! ## Fast paths
//! * [`warm`]: a warm Python interpreter per slot, forked once for each `run_python` into
//!   fresh pid and mount namespaces with the same containment (pid 1 there is a tiny idle
//!   init it starts with a vfork and exec; the run is pid 2).
//! * [`session`]: a persistent work dir (an overlay of frozen layers) for multi-turn agents,
//!   with O(1) reset, snapshot and restore.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cgroup;
pub mod config;
pub mod error;
pub mod fdpass;
pub mod ids;
pub mod init;
pub mod limits;
pub mod mounts;
pub mod net;
pub mod preflight;
mod retry;
pub mod rlimit;
mod run;
pub mod sandbox;
pub mod seccomp;
pub mod session;
pub mod spawn;
pub mod supervise;
pub mod sys;
pub mod tee;
pub mod verdict;
pub mod warm;

pub use config::{Bind, RunRequest, SandboxConfig};
pub use error::{Error, Result};
pub use limits::Limits;
pub use sandbox::Sandbox;
pub use session::{Session, Snapshot};
pub use verdict::{ExecResult, LimitKind, Status};
