//! The I/O phase ([`prepare`]): a run's channels ([`RunIo`]: its tmpfs, stdin, output and
//! status pipes, the listener's socket), made for it or taken from the slot's spare set; and
//! what a slot does between two runs ([`Between`], [`between_runs`]): free what the last run
//! left, make the next spare set.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use super::error::Cause;
use super::fds::{memfd_with, pipe, set_nonblocking};
use crate::fdpass;
use crate::mounts::RunFs;
use crate::sandbox::{Prepared, Slot};

/// The per-run channels: the tmpfs, stdin, output pipes, the set-up status pipe and the
/// socket the child hands its seccomp listener through.
pub(crate) struct RunIo {
    pub channels: Channels,
    pub stdin: OwnedFd,
}

/// The channels of a run that do not depend on its input, so that a slot can make them
/// before the run is asked for.
pub(crate) struct Channels {
    pub runfs: RunFs,
    pub out_r: OwnedFd,
    pub out_w: OwnedFd,
    pub err_r: OwnedFd,
    pub err_w: OwnedFd,
    pub status_r: OwnedFd,
    pub status_w: OwnedFd,
    pub sock_parent: OwnedFd,
    pub sock_child: OwnedFd,
    /// What the tmpfs was made for: its size and the host id owning its directories.
    made_for: (u64, u32),
}

impl Channels {
    fn new(tmpfs_bytes: u64, host_id: u32) -> Result<Channels, Cause> {
        let runfs = RunFs::empty(tmpfs_bytes, host_id, host_id)
            .map_err(Cause::io("creating the run tmpfs"))?;
        let (out_r, out_w) = pipe().map_err(Cause::io("pipe"))?;
        let (err_r, err_w) = pipe().map_err(Cause::io("pipe"))?;
        let (status_r, status_w) = pipe().map_err(Cause::io("pipe"))?;
        let (sock_parent, sock_child) =
            fdpass::seqpacket_pair().map_err(Cause::io("socketpair"))?;
        set_nonblocking(out_r.as_raw_fd());
        set_nonblocking(err_r.as_raw_fd());
        // The box may reopen its own output through `/dev/stdout`, `/dev/stderr` or
        // `/proc/self/fd/N` (a pipe's inode is mode 0600), as any process may its own pipes.
        for fd in [&out_w, &err_w] {
            give_to(fd.as_fd(), host_id).map_err(Cause::io("handing the output pipes over"))?;
        }
        Ok(Channels {
            runfs,
            out_r,
            out_w,
            err_r,
            err_w,
            status_r,
            status_w,
            sock_parent,
            sock_child,
            made_for: (tmpfs_bytes, host_id),
        })
    }
}

/// The I/O phase: the run's channels, with its input files and stdin written, owned by the
/// run's host id (a session's, or the slot's, whose tmpfs size the slot's spare then follows).
pub(super) fn prepare(slot: &mut Slot, run: &Prepared) -> Result<RunIo, Cause> {
    let host_id = run
        .session
        .as_ref()
        .map(|(_, id)| *id)
        .unwrap_or(slot.host_id);
    if run.session.is_none() {
        slot.between.last_tmpfs_bytes = Some(run.limits.tmpfs_bytes);
    }
    RunIo::new(&mut slot.between, run, host_id)
}

impl RunIo {
    /// The run's channels: the slot's spare ones when they fit, else new ones (a spare that
    /// does not fit, say for a session step, stays for the slot's next ordinary run).
    fn new(between: &mut Between, run: &Prepared, host_id: u32) -> Result<RunIo, Cause> {
        let want = (run.limits.tmpfs_bytes, host_id);
        let channels = match between.spare.take_if(|c| c.made_for == want) {
            Some(c) => c,
            None => Channels::new(want.0, want.1)?,
        };
        channels
            .runfs
            .write_inputs(&run.files, host_id, host_id)
            .map_err(Cause::io("creating the run tmpfs"))?;
        let stdin = memfd_with(&run.stdin).map_err(Cause::io("preparing stdin"))?;
        give_to(stdin.as_fd(), host_id).map_err(Cause::io("preparing stdin"))?;
        Ok(RunIo { channels, stdin })
    }
}

/// What a slot does between two runs, off its caller's critical path: once the caller has
/// the verdict, it frees what the run left (above all the box's mount namespace, whose
/// teardown waits for an RCU grace period) and makes the channels of the next run.
#[derive(Default)]
pub(crate) struct Between {
    /// Dropped after the verdict is delivered.
    garbage: Vec<Box<dyn std::any::Any>>,
    /// Channels made for the next run, for the tmpfs size and host id of the last one.
    spare: Option<Channels>,
    /// The tmpfs size of the last run that used the slot's own host id.
    last_tmpfs_bytes: Option<u64>,
}

impl Between {
    pub(super) fn defer(&mut self, what: impl std::any::Any) {
        self.garbage.push(Box::new(what));
    }
}

/// Runs between two runs of a slot, after the caller has the verdict of the first: frees what
/// it left, then makes spare channels like those of the last ordinary run, unless it has them
/// already. A failure only means no spare (the next run makes its own channels and reports
/// the error).
pub(crate) fn between_runs(slot: &mut Slot) {
    let b = &mut slot.between;
    b.garbage.clear();
    let Some(size) = b.last_tmpfs_bytes else {
        return;
    };
    let want = (size, slot.host_id);
    if b.spare.as_ref().map(|c| c.made_for) != Some(want) {
        // The stale spare's fds go first: a slot never holds two sets.
        b.spare = None;
        b.spare = Channels::new(want.0, want.1).ok();
    }
}

/// Makes the box user (host id `id`, uid and gid) the owner of the inode behind `fd`: the
/// pipes and memfd of its standard streams, which it may then reopen (`/dev/stdout`) as a
/// process may its own pipes on a host. Nothing else of the host runs under that id.
fn give_to(fd: BorrowedFd<'_>, id: u32) -> std::io::Result<()> {
    // SAFETY: fchown on a valid fd changes only that inode's owner.
    if unsafe { libc::fchown(fd.as_raw_fd(), id, id) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
