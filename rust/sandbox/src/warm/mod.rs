//! The warm-interpreter fast path.
//!
//! Python start-up costs tens of milliseconds, far more than isolation. Each slot can keep a
//! **warm interpreter** ([`WarmInterpreter`]): a trusted Python process started once inside a box of
//! the slot, with the configured modules already imported. A warm run is a `fork` of it, made
//! by the interpreter on request over a control socket ([`serve`]), into new pid, mount and
//! IPC namespaces (pid 1 there is the idle init of [`crate::init`]; the run is pid 2), with the
//! same containment as a cold run: its own `/work`, `/tmp`, `/dev/shm`, `/proc` and
//! `/dev/pts`, the box user, no capabilities, `no_new_privs` and the same seccomp filter.
//!
//! The design (namespaces, the idle init, reaping, what happens when the interpreter dies) is
//! in `docs/design/warm.md`.
//!
//! Layout: `host` (the host side: [`WarmInterpreter`], start, launch, exit), `wire` (the request
//! format), and the interpreter's side: `interp` ([`serve`]), `idle_init` (the run's pid 1),
//! `reap` (reaping and the exit report), `child` (set-up in the forked run), `shown_args`
//! (the run's `/proc/self/cmdline`), `tests`.

use std::time::Duration;

mod child;
mod host;
mod idle_init;
mod interp;
mod reap;
mod shown_args;
#[cfg(test)]
mod tests;
mod wire;

pub use child::interpreter_init;
pub use host::WarmInterpreter;
pub(crate) use host::{discard, ensure, is_alive, launch, release, wait_exit};
pub use interp::{release_free_heap, serve, Interpreter};
pub use wire::{encode_env, Env};

/// Where the extension module is bound inside the box (the bootstrap loads it from there).
pub const CORE_MODULE_IN_BOX: &str = "/.agentrl/_core.so";

/// How to start a warm interpreter.
#[derive(Debug, Clone)]
pub struct WarmConfig {
    /// The full command (`python -I -c BOOTSTRAP`), built by the Python layer.
    pub argv: Vec<String>,
    /// Host path of the compiled extension module, bound at [`CORE_MODULE_IN_BOX`].
    pub core_module: std::path::PathBuf,
    /// How long the interpreter may take to start and import its modules.
    pub start_timeout: Duration,
}
