//! What a sandbox's slots and callers share: the queue of runs and the slots' count
//! ([`Queue`]), a run's reply ([`Reply`]), the host-wide set-up made once ([`Shared`]) and
//! the cancel flags of the runs waiting or in flight ([`Inflight`]).

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::Prepared;
use crate::cgroup;
use crate::config::SandboxConfig;
use crate::mounts::Layout;
use crate::seccomp::Filter;
use crate::verdict::ExecResult;

/// Where a slot puts a run's verdict for the caller waiting on it.
pub(super) struct Reply {
    pub(super) slot: Mutex<Option<ExecResult>>,
    pub(super) cv: Condvar,
}

/// A run waiting in the queue, and where its verdict goes.
pub(super) struct Job {
    pub(super) run: Prepared,
    pub(super) reply: Arc<Reply>,
}

/// The runs waiting for a slot, and the slots' count.
pub(super) struct Queue {
    pub(super) jobs: VecDeque<Job>,
    /// Slots running a job (from taking it to just before its reply): the others are idle,
    /// starting, or back for the next job at once.
    pub(super) busy: usize,
    pub(super) slots: usize,
    pub(super) next_index: usize,
    pub(super) closed: bool,
    /// After a slot failed to start, no other is tried before this (the existing slots serve
    /// the queue): a cause that lasts would otherwise cost a thread and a network namespace
    /// per queued run.
    pub(super) no_growth_until: Option<std::time::Instant>,
}

/// The state of a sandbox that its handle and its slot threads share.
pub(crate) struct Shared {
    pub config: SandboxConfig,
    /// The session manager, started with the first session.
    pub(super) sessions: Mutex<Option<Arc<crate::session::Manager>>>,
    /// The base environment as C strings (for the warm interpreter).
    pub base_env: Vec<CString>,
    pub(super) layout: Layout,
    pub filter: Filter,
    /// The cgroup manager; taken (and its base cgroups removed) by `close`.
    pub(super) cgroups: Mutex<Option<cgroup::Manager>>,
    pub cgroup_version: Option<cgroup::Version>,
    pub(super) queue: Mutex<Queue>,
    pub(super) cv: Condvar,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    pub cap_last: u32,
    /// The host ids the boxes may use.
    pub(super) ids: crate::ids::IdSpace,
    /// Whether the host process was dumpable when the sandbox was made: the uid switches of
    /// the spawn path clear that flag, and they restore it.
    pub host_dumpable: bool,
    /// The cancel flags of the runs waiting or in flight, by a per-sandbox number (see
    /// [`Sandbox::close_now`](super::Sandbox::close_now)).
    pub(super) inflight: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    pub(super) next_run: AtomicU64,
    /// A warm run has been asked for: slots added from then on start their warm interpreter
    /// before taking a run, rather than with the first one (which would wait for the boot
    /// while the other slots could have served it).
    pub(super) warm_asked: AtomicBool,
    /// The process that made the sandbox. A child made with `fork()` inherits a copy of this
    /// handle but none of the slot threads behind it: there it refuses runs and leaves the
    /// parent's processes and cgroups alone.
    pub(super) owner_pid: u32,
    /// This sandbox's share of the room made in the process's open-file limit.
    pub(super) _fd_room: crate::rlimit::FdRoom,
}

impl Shared {
    /// A fresh cgroup for one run of slot `index` (see [`cgroup::Manager::create_run_cgroup`]);
    /// `None` when the sandbox has no cgroups (degraded).
    pub(crate) fn run_cgroup(
        &self,
        index: usize,
    ) -> std::result::Result<Option<cgroup::Slot>, cgroup::CgroupError> {
        let manager = self.cgroups.lock().unwrap_or_else(|e| e.into_inner());
        manager
            .as_ref()
            .map(|m| m.create_run_cgroup(index))
            .transpose()
    }
}

/// A run's cancel flag, listed in `Shared::inflight` while the run waits or runs.
pub(super) struct Inflight<'a> {
    pub(super) shared: &'a Shared,
    pub(super) id: u64,
}

impl<'a> Inflight<'a> {
    pub(super) fn register(shared: &'a Shared, cancel: &Arc<AtomicBool>) -> Inflight<'a> {
        let id = shared.next_run.fetch_add(1, Ordering::Relaxed);
        shared
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, cancel.clone());
        Inflight { shared, id }
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.shared
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}
