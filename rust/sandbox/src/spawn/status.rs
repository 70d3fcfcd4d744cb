//! The child's status record: the [`Step`]s it can fail at (one table: the enum, its
//! decoding and its description cannot drift apart), and the async-signal-safe writers of
//! the 8-byte `(step, errno)` record the parent reads (`crate::run` reads it).

use std::os::fd::RawFd;

use crate::sys::syscall3;

/// Declares [`Step`] with the text of each step in one table: the enum, its decoding and its
/// description cannot drift apart.
macro_rules! steps {
    ($($(#[$doc:meta])* $name:ident $(= $value:literal)? => $text:literal,)*) => {
        /// The steps a child can fail at, reported to the parent.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u32)]
        pub enum Step {
            $($(#[$doc])* $name $(= $value)?,)*
        }

        impl Step {
            pub(super) const ALL: &'static [Step] = &[$(Step::$name,)*];

            /// Decodes a step number.
            pub fn from_u32(v: u32) -> Option<Step> {
                Self::ALL.iter().copied().find(|s| *s as u32 == v)
            }

            /// What the step does, for error messages.
            pub fn describe(self) -> &'static str {
                match self {
                    $(Step::$name => $text,)*
                }
            }
        }
    };
}

steps! {
    Sync = 1 => "waiting for the supervisor",
    BindRoot => "binding the root template",
    MountRun => "attaching the run tmpfs (move_mount)",
    BindWork => "binding /work",
    BindTmp => "binding /tmp",
    BindShm => "binding /dev/shm",
    MountProc => "mounting /proc",
    BindProcSys => "binding /proc/sys",
    MountPts => "mounting the box's own /dev/pts (devpts)",
    RemountProcSys => "making /proc/sys read-only",
    ChdirRoot => "entering the new root",
    PivotRoot => "pivot_root",
    DetachOldRoot => "detaching the host root",
    CgroupNs => "unsharing the cgroup namespace",
    MountCgroup => "mounting the box's own /sys/fs/cgroup (cgroup2)",
    Hostname => "setting the hostname",
    Setsid => "setsid",
    Stdio => "setting up stdin/stdout/stderr",
    Rlimit => "setting rlimits",
    CapBound => "dropping the capability bounding set",
    Setgroups => "setgroups",
    Setgid => "setresgid",
    Setuid => "setresuid",
    Capset => "clearing capabilities",
    NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
    DeathSig => "PR_SET_PDEATHSIG",
    Chdir => "entering the working directory",
    Signals => "resetting signal dispositions",
    Seccomp => "installing the seccomp filter",
    SendListener => "handing the seccomp listener to the supervisor",
    Exec => "execve",
    Spawn => "starting the program's process",
    /// Not a failure: the program has started (pid 1 is becoming its init).
    Started => "started",
}

/// Writes one 8-byte status record (step, errno). Async-signal-safe.
#[inline(always)]
pub(super) fn write_record(fd: RawFd, step: Step, errno: i32) {
    let mut rec = [0u8; 8];
    let s = (step as u32).to_ne_bytes();
    let e = errno.to_ne_bytes();
    let mut i = 0;
    while i < 4 {
        rec[i] = s[i];
        rec[4 + i] = e[i];
        i += 1;
    }
    // SAFETY: rec is a valid 8-byte buffer; a failed write changes nothing.
    unsafe { syscall3(libc::SYS_write, fd as usize, rec.as_ptr() as usize, 8) };
}

/// Writes the record of a failed step and exits (126, or 127 when `execve` failed).
#[inline(always)]
pub(super) fn report(fd: RawFd, step: Step, errno: i32) -> ! {
    let mut rec = [0u8; 8];
    let s = (step as u32).to_ne_bytes();
    let e = errno.to_ne_bytes();
    let mut i = 0;
    while i < 4 {
        rec[i] = s[i];
        rec[4 + i] = e[i];
        i += 1;
    }
    // SAFETY: rec is a valid 8-byte buffer; fd is our status pipe (or any fd: a failed write
    // changes nothing). exit_group never returns.
    unsafe {
        syscall3(libc::SYS_write, fd as usize, rec.as_ptr() as usize, 8);
        syscall3(
            libc::SYS_exit_group,
            if step == Step::Exec { 127 } else { 126 },
            0,
            0,
        );
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

/// Runs a raw system call (`$call`, returning `-errno` on failure) for step `$step`; on
/// failure, reports it on `$plan`'s status pipe and exits.
macro_rules! step {
    ($plan:expr, $step:expr, $call:expr) => {{
        let r = $call;
        if r < 0 {
            $crate::spawn::status::report($plan.status_write, $step, (-r) as i32);
        }
        r
    }};
}
pub(super) use step;
