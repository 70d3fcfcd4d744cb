//! A slot: the thread that owns one box's worth of isolation ([`Slot`]: a private mount
//! namespace with the root template, a network namespace, a cgroup, host ids, the child
//! stacks), how it is added ([`start_slot`]) and set up, and its loop: take a run from the
//! queue, run it (`crate::run`), reply, then do the work between runs.

use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::cgroup;
use crate::error::{Error, Result};
use crate::mounts::{CgroupView, ChildPaths, Template};
use crate::run::run_in_slot;
use crate::spawn::ChildStack;
use crate::verdict::ExecResult;
use crate::warm::WarmInterpreter;

/// Adds a slot (up to `max_concurrency`). `wait`: until it is ready, returning its set-up
/// error (the first slot, made by [`Sandbox::new`](super::Sandbox::new)). Otherwise the
/// caller goes on at once: a slot added because runs are queueing serves them once ready,
/// while the existing slots go on serving them meanwhile; its set-up can take long (creating
/// a network namespace waits for the kernel's clean-up of dead ones, over a second at
/// times), and a failure only means one slot fewer.
pub(super) fn start_slot(shared: &Arc<Shared>, wait: bool) -> Result<()> {
    let index = {
        let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.closed || q.slots >= shared.config.max_concurrency {
            return Ok(());
        }
        q.slots += 1;
        q.next_index += 1;
        q.next_index - 1
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let sh = shared.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("agentrl-slot-{index}"))
        .spawn(move || slot_main(sh, index, tx));
    let handle = match spawned {
        Ok(h) => h,
        Err(e) => {
            shared.queue.lock().unwrap_or_else(|e| e.into_inner()).slots -= 1;
            return Err(Error::setup_io("starting a slot thread", e));
        }
    };
    let ready = if wait {
        rx.recv()
    } else {
        // Dropping the receiver: the slot's report of its set-up goes nowhere.
        Ok(Ok(()))
    };
    match ready {
        Ok(Ok(())) => {
            shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(handle);
            Ok(())
        }
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => {
            let _ = handle.join();
            Err(Error::setup("the slot thread died while starting"))
        }
    }
}

/// Everything a slot owns.
pub(crate) struct Slot {
    pub paths: ChildPaths,
    pub stack: ChildStack,
    /// The program's own stack (pid 2 of a box, started by pid 1).
    pub stack2: ChildStack,
    pub init_path: CString,
    pub cgroup: Option<cgroup::Slot>,
    /// Host uid/gid of the box user of this slot.
    pub host_id: u32,
    /// Host uid/gid of the slot's warm interpreter (root of its user namespace).
    pub warm_host_id: u32,
    pub interpreter: Option<WarmInterpreter>,
    /// Work done between runs, off the callers' critical path.
    pub between: crate::run::Between,
    _ids: crate::ids::Claim,
    _template: Template,
}

/// The slot thread: sets the slot up, reports that to [`start_slot`], then serves the queue
/// until the sandbox closes.
fn slot_main(shared: Arc<Shared>, index: usize, ready: std::sync::mpsc::Sender<Result<()>>) {
    let slot = match init_slot(&shared, index) {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            {
                let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.slots -= 1;
                q.no_growth_until = Some(std::time::Instant::now() + Duration::from_secs(1));
            }
            // `close` may be waiting for the slot count to reach 0.
            shared.cv.notify_all();
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut slot = slot;
    if shared.warm_asked.load(Ordering::Relaxed) {
        // A failure here is reported by the first warm run, which tries again.
        let _ = crate::warm::ensure(&shared, &mut slot);
    }
    loop {
        let job = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    q.busy += 1;
                    break Some(j);
                }
                if q.closed {
                    break None;
                }
                let (guard, timed_out) = shared
                    .cv
                    .wait_timeout(q, std::time::Duration::from_secs(1))
                    .unwrap_or_else(|e| e.into_inner());
                q = guard;
                if timed_out.timed_out()
                    && slot
                        .interpreter
                        .as_ref()
                        .is_some_and(|z| !crate::warm::is_alive(z))
                {
                    // Reap a warm interpreter that died while the slot was idle.
                    slot.interpreter = None;
                }
            }
        };
        let Some(job) = job else { break };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_in_slot(&shared, &mut slot, &job.run)
        }))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            ExecResult::sandbox_error(format!("internal error in the supervisor: {msg}"))
        });
        // Not busy any more before the caller learns the result (see `busy`).
        shared.queue.lock().unwrap_or_else(|e| e.into_inner()).busy -= 1;
        *job.reply.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        job.reply.cv.notify_one();
        crate::run::between_runs(&mut slot);
    }
    if let Some(cg) = &slot.cgroup {
        let _ = cg.kill_all();
        let tid = crate::sys::gettid();
        let _ = v1_move_thread(cg, tid, true);
    }
    drop(slot);
    shared.queue.lock().unwrap_or_else(|e| e.into_inner()).slots -= 1;
    shared.cv.notify_all();
}

/// Cgroup v1 only: moves one thread (not its whole process) into the slot's cgroups, or back
/// to the process's own cgroups (the parents of the sandbox's base cgroups).
fn v1_move_thread(cg: &cgroup::Slot, tid: libc::pid_t, back: bool) -> std::io::Result<()> {
    for dir in cg.paths() {
        let target = if back {
            dir.parent().and_then(|p| p.parent()).unwrap_or(dir)
        } else {
            dir.as_path()
        };
        std::fs::write(target.join("tasks"), tid.to_string())?;
    }
    Ok(())
}

/// Makes what a slot owns, on its own thread (its mount and network namespaces are the
/// thread's).
fn init_slot(shared: &Shared, index: usize) -> Result<Slot> {
    // The slot thread handles no signals; children inherit the full mask and reset it.
    // SAFETY: sigfillset/pthread_sigmask on a local, valid sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    // A private mount namespace for this thread alone.
    crate::mounts::private_mount_namespace("slot's")?;
    if !shared.config.network {
        crate::net::unshare_thread_netns()
            .map_err(|e| Error::setup_io("creating the slot's network namespace", e))?;
    }
    let manager = shared.cgroups.lock().unwrap_or_else(|e| e.into_inner());
    if manager.is_none() && shared.cgroup_version.is_some() {
        return Err(Error::Closed);
    }
    let cgroup = match manager.as_ref() {
        Some(m) => {
            let s = m
                .create_slot(index)
                .map_err(|e| Error::setup(format!("creating the slot cgroup: {e}")))?;
            Some((s, m.version() == cgroup::Version::V1))
        }
        None => None,
    };
    drop(manager);
    // The box sees its own cgroup (read-only) under /sys/fs/cgroup. On v1 the template binds
    // the slot's directories there; on v2 every box mounts a cgroup2 view of its own instead
    // (rooted at its cgroup namespace: the slot's cgroup, or a cold run's own, see
    // `run::place::run_cgroup`), so the template leaves the directory empty.
    let view = match &cgroup {
        Some((s, true)) => CgroupView::new(s.paths()),
        _ => CgroupView::default(),
    };
    let template = Template::build(&shared.layout, &view)?;
    let paths = ChildPaths::new(&template.mountpoint);
    let stack =
        ChildStack::new(256 << 10).map_err(|e| Error::setup_io("allocating the child stack", e))?;
    // Two host ids per slot: the box user, and the slot's warm interpreter; the block is
    // claimed host-wide so that no other sandbox (of this or another process) uses it.
    let claim = shared
        .ids
        .claim("slot", shared.ids.slot_blocks)
        .map_err(|e| Error::setup_io("claiming host ids for the slot", e))?;
    let host_id = claim
        .index
        .checked_mul(2)
        .and_then(|i| shared.ids.base.checked_add(i))
        .filter(|i| i.checked_add(1).is_some())
        .ok_or_else(|| Error::invalid("host_id_base", "too large"))?;
    let stack2 =
        ChildStack::new(128 << 10).map_err(|e| Error::setup_io("allocating the child stack", e))?;
    // Last, once nothing else can fail: a thread left in a slot cgroup would keep it from
    // being removed when the half-made slot is dropped.
    let cgroup = match cgroup {
        Some((s, true)) => {
            // v1 lets one thread join a cgroup: boxes cloned from this thread start inside
            // it, with no per-run migration.
            let tid = crate::sys::gettid();
            if let Err(e) = v1_move_thread(&s, tid, false) {
                let _ = v1_move_thread(&s, tid, true);
                return Err(Error::setup_io("joining the slot cgroup", e));
            }
            Some(s)
        }
        Some((s, false)) => Some(s),
        None => None,
    };
    Ok(Slot {
        paths,
        stack,
        stack2,
        init_path: CString::new(crate::init::PATH).expect("no NUL"),
        cgroup,
        host_id,
        warm_host_id: host_id + 1,
        interpreter: None,
        between: Default::default(),
        _ids: claim,
        _template: template,
    })
}
