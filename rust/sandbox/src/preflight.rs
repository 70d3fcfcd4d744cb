//! The checks every sandbox backend makes before anything else: the kernel and the privileges.
//!
//! agentrl's boxes are built from namespaces (mount, pid, network, IPC, UTS, user), unused host
//! uids mapped into the box, and cgroups: all of that needs root in the host's user namespace
//! with `CAP_SYS_ADMIN` (the capability that `unshare`, `mount` and `setns` ask for), on a
//! kernel that has the calls the box is built with. Without them nothing would work, and every
//! later failure would name a different symptom; so these checks run first and say, in one
//! line, what is missing and where to read more.
//!
//! The oldest kernel is [`MIN_KERNEL`], 5.12: each box's root is made read-only with
//! `mount_setattr` (5.12), on a tmpfs made with `fsopen`/`fsmount` (5.2), paths inside it are
//! resolved with `openat2` (5.6), runs start with `clone3` and pidfds (5.3) into their cgroup.
//! Newer features have fallbacks (see [`crate::cgroup`] for the peak memory counter).

use crate::error::{Error, Result};

/// Bit of `CAP_SYS_ADMIN` in the capability sets (`linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;

/// Where the documentation of running agentrl (root, containers, Kubernetes) lives.
pub const DOCS: &str = "https://github.com/agentrl/agentrl/blob/main/docs/deployment.md";

/// The oldest kernel the sandbox runs on (see the module docs).
pub const MIN_KERNEL: (u32, u32) = (5, 12);

/// `(major, minor)` of a kernel release string such as `6.1.0-57-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Why this kernel is too old, or `None`.
fn kernel_too_old(release: &str) -> Option<String> {
    let v = kernel_version(release)?;
    (v < MIN_KERNEL).then(|| {
        format!(
            "agentrl's sandbox needs Linux {}.{} or newer (this kernel is {release}): each box's \
             root is made read-only with mount_setattr; see {DOCS}",
            MIN_KERNEL.0, MIN_KERNEL.1
        )
    })
}

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
    let way = if euid == 0 {
        "run in a container started with --privileged (or --cap-add SYS_ADMIN and \
         seccomp/AppArmor unconfined)"
    } else {
        "run as root, or without root under `agentrl rootless -- CMD` (a user namespace with \
         this user's subordinate ids)"
    };
    Some(format!(
        "agentrl's sandbox needs CAP_SYS_ADMIN ({what}): it creates namespaces, maps unused \
         ids into each box and manages cgroups; {way}; see {DOCS}"
    ))
}

/// Fails with one clear line when this process cannot build boxes (see the module docs).
pub fn check() -> Result<()> {
    // SAFETY: uname fills the plain-data struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } == 0 {
        // SAFETY: the kernel NUL-terminates `release` within the array.
        let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
        if let Some(why) = kernel_too_old(&release.to_string_lossy()) {
            return Err(Error::setup(why));
        }
    }
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
        assert!(m.contains("agentrl rootless -- CMD"), "{m}");
        assert!(m.contains(DOCS), "{m}");
        let m = missing(0, Some(ROOT_NO_ADMIN)).unwrap();
        assert!(m.contains("root but lacks CAP_SYS_ADMIN"), "{m}");
        assert!(m.contains("--privileged"), "{m}");
        assert!(!m.contains('\n'), "one line: {m}");
    }

    #[test]
    fn kernel_releases_are_compared_by_major_and_minor() {
        assert_eq!(kernel_version("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.15.0-1234-azure"), Some((5, 15)));
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("4.18.0-553.el8_10.x86_64"), Some((4, 18)));
        assert_eq!(kernel_version("garbage"), None);
        assert_eq!(kernel_too_old("5.12.0"), None);
        assert_eq!(kernel_too_old("6.1.0-57-amd64"), None);
        let m = kernel_too_old("5.10.0-46-amd64").unwrap();
        assert!(
            m.contains("Linux 5.12 or newer (this kernel is 5.10.0-46-amd64)"),
            "{m}"
        );
        assert!(kernel_too_old("4.18.0-553.el8_10.x86_64").is_some());
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
