//! The seccomp-bpf system-call policy of a box, and the supervisor that answers its denials.
//!
//! The filter allows ordinary programs' calls, checks the arguments of a few (`clone`, `socket`,
//! `socketpair`, `ioctl`, `personality`, `setrlimit`, `prlimit64`), refuses the calls shaped like
//! an attack through `SECCOMP_RET_USER_NOTIF`, so that the supervisor ([`answer_notification`])
//! names them in the verdict, and refuses a few that ordinary programs meet and handle with a
//! plain errno. The rationale (each class of call, `clone3`, tracing, networking, the
//! architecture checks, the shape of the program, the contract with the spawn pipeline) is in
//! `docs/design/seccomp.md`.
//!
//! In short: [`Filter::compile`] a [`Policy`] in the parent before `clone`; in the child, after
//! every setup step and `PR_SET_NO_NEW_PRIVS`, [`Filter::install`], [`send_fd`] the listener to
//! the parent, close it, `execve`; the parent takes it with [`recv_fd`] and calls
//! [`answer_notification`] whenever it is readable. [`describe`] gives the policy in words, for
//! other enforcers.

mod bpf;
mod description;
mod notify;
mod policy;
mod tables;
#[cfg(test)]
mod tests;

pub use bpf::{Filter, AUDIT_ARCH_NATIVE, PINNED_RLIMIT};
pub use description::{describe, PolicyDescription};
pub use notify::{answer_notification, recv_fd, send_fd, Denial};
pub use policy::Policy;

/// Kernel name of system call `nr` on the native architecture, if this crate knows it.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    tables::name(nr)
}
