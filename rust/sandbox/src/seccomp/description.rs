//! The policy in words ([`PolicyDescription`]), for enforcers other than this crate's filter.

use super::bpf::{rules, Leaf, PINNED_RLIMIT, RET_ALLOW, RET_ENOSYS, RET_NOTIFY};
use super::policy::{
    Policy, ALLOWED_PERSONAS, CLONE_NAMESPACE_FLAGS, LOCAL_DOMAINS, LOCAL_NETLINK_PROTOCOLS,
    NETWORK_DOMAINS, PLAIN_NETLINK_PROTOCOLS, REFUSED_IOCTLS,
};
use super::syscall_name;

/// The policy in words, for other enforcers (the nsjail backend compiles it to Kafel).
#[derive(Debug, Clone, Default)]
pub struct PolicyDescription {
    /// Allowed whatever the arguments.
    pub allow: Vec<&'static str>,
    /// Refused with `EPERM`.
    pub deny: Vec<&'static str>,
    /// Refused with `ENOSYS` without a report (`clone3`, and the `ENOSYS` ones of
    /// `ERRNO_PLAIN`).
    pub enosys: Vec<&'static str>,
    /// Refused without a report with another errno (`syslog`: `EPERM`).
    pub errno: Vec<(&'static str, i32)>,
    /// `clone` flags that are refused (`EPERM`).
    pub clone_refused_flags: u32,
    /// `socket`/`socketpair` domains that are allowed (others: `EAFNOSUPPORT`).
    pub socket_domains: Vec<u32>,
    /// `None`: `AF_NETLINK` is in `socket_domains` (any protocol). Otherwise the `AF_NETLINK`
    /// protocols (arg2) that are allowed; others get `EPROTONOSUPPORT`.
    pub netlink_protocols: Option<Vec<u32>>,
    /// `AF_NETLINK` protocols refused with `EPROTONOSUPPORT` without a report.
    pub plain_netlink_protocols: Vec<u32>,
    /// `ioctl` requests that are refused (`EPERM`).
    pub refused_ioctls: Vec<u32>,
    /// `personality` values that are allowed (others: `EPERM`).
    pub personalities: Vec<u32>,
    /// Resources whose limit `setrlimit`/`prlimit64` may not change (see [`PINNED_RLIMIT`]);
    /// the calls are allowed otherwise.
    pub pinned_rlimits: Vec<u32>,
}

/// Describes the policy [`Filter::compile`](super::Filter::compile) enforces.
pub fn describe(policy: &Policy) -> PolicyDescription {
    let name = |nr: u32| syscall_name(nr as i64);
    let mut d = PolicyDescription {
        clone_refused_flags: CLONE_NAMESPACE_FLAGS,
        refused_ioctls: REFUSED_IOCTLS.to_vec(),
        personalities: ALLOWED_PERSONAS.to_vec(),
        pinned_rlimits: vec![PINNED_RLIMIT],
        ..Default::default()
    };
    if policy.allow_network {
        d.socket_domains = NETWORK_DOMAINS.to_vec();
    } else {
        d.socket_domains = LOCAL_DOMAINS.to_vec();
        d.netlink_protocols = Some(LOCAL_NETLINK_PROTOCOLS.to_vec());
        d.plain_netlink_protocols = PLAIN_NETLINK_PROTOCOLS.to_vec();
    }
    for (nr, leaf) in rules() {
        let Some(n) = name(nr) else { continue };
        match leaf {
            Leaf::Ret(RET_ALLOW) => d.allow.push(n),
            Leaf::Ret(RET_NOTIFY) => d.deny.push(n),
            Leaf::Ret(RET_ENOSYS) => d.enosys.push(n),
            Leaf::Ret(action) => d.errno.push((n, (action & libc::SECCOMP_RET_DATA) as i32)),
            _ => {}
        }
    }
    d
}
