//! The one privilege check every sandbox backend makes before anything else.
//!
//! agentrl's boxes are built from namespaces (mount, pid, network, IPC, UTS, user), unused host
//! uids mapped into the box, and cgroups: all of that needs root in the host's user namespace
//! with `CAP_SYS_ADMIN` (the capability that `unshare`, `mount` and `setns` ask for). Without
//! it nothing would work, and every later failure would name a different symptom; so this
//! check runs first and says, in one line, what is missing and where to read more.

use crate::error::{Error, Result};

/// Bit of `CAP_SYS_ADMIN` in the capability sets (`linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;

/// Where the documentation of running agentrl (root, containers, Kubernetes) lives.
pub const DOCS: &str = "https://github.com/agentrl/agentrl/blob/main/docs/deployment.md";

/// The effective capability set, from the `CapEff:` line of `/proc/self/status`.
fn effective_caps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// What is missing for a box, given the effective uid and `/proc/self/status`; `None` if
/// nothing.
fn missing(euid: u32, status: Option<&str>) -> Option<String> {
    let has_admin = status
        .and_then(effective_caps)
        .map(|c| c & (1 << CAP_SYS_ADMIN) != 0);
    let what = match (euid, has_admin) {
        (0, Some(true)) => return None,
        (0, Some(false)) => "this process is root but lacks CAP_SYS_ADMIN".to_string(),
        (0, None) => return None, // no /proc to ask: the first namespace call will tell
        (uid, _) => format!("this process runs as uid {uid}, not root"),
    };
    Some(format!(
        "agentrl's sandbox needs root with CAP_SYS_ADMIN ({what}): it creates namespaces, maps \
         unused host uids into each box and manages cgroups. Run as root, or in a container \
         started with --privileged (or --cap-add SYS_ADMIN and seccomp/AppArmor unconfined); \
         see {DOCS}"
    ))
}

/// Fails with one clear line when this process cannot build boxes (see the module docs).
pub fn check() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let status = std::fs::read_to_string("/proc/self/status").ok();
    match missing(euid, status.as_deref()) {
        None => Ok(()),
        Some(why) => Err(Error::setup(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_ALL: &str = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
    const ROOT_NO_ADMIN: &str = "CapEff:\t00000000a80425fb\n"; // Docker's default set

    #[test]
    fn root_with_cap_sys_admin_passes() {
        assert_eq!(missing(0, Some(ROOT_ALL)), None);
        assert_eq!(missing(0, None), None);
    }

    #[test]
    fn each_missing_privilege_is_named_with_the_docs() {
        let m = missing(1000, Some("CapEff:\t0000000000000000\n")).unwrap();
        assert!(m.contains("uid 1000, not root"), "{m}");
        assert!(m.contains(DOCS), "{m}");
        let m = missing(0, Some(ROOT_NO_ADMIN)).unwrap();
        assert!(m.contains("root but lacks CAP_SYS_ADMIN"), "{m}");
        assert!(!m.contains('\n'), "one line: {m}");
    }

    #[test]
    fn this_process() {
        // The test runs as whoever runs it: the check agrees with the kernel's own view.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let admin = effective_caps(&status).unwrap() & (1 << CAP_SYS_ADMIN) != 0;
        assert_eq!(check().is_ok(), euid == 0 && admin);
    }
}
