//! What a sandbox is built from, and what one run asks for.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::limits::Limits;

/// Path of the work dir inside the box (the initial working directory).
pub const WORK_DIR: &str = "/work";

/// An extra bind mount requested by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Host path (must exist).
    pub source: PathBuf,
    /// Path inside the box (absolute).
    pub target: PathBuf,
    /// Read-write instead of read-only. Writes reach the host: use with care.
    pub writable: bool,
}

/// Configuration of a [`crate::Sandbox`].
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Default limits of each run.
    pub limits: Limits,
    /// Share the host network. UNSAFE: the box can reach every service the host reaches.
    pub network: bool,
    /// Read-only binds of the system runtime and interpreters, added to the built-in ones
    /// (`/usr`, `/bin`, `/lib*`). Each is bound at the same path.
    pub system_paths: Vec<PathBuf>,
    /// Extra binds asked for by the caller.
    pub binds: Vec<Bind>,
    /// Base environment of every run (nothing of the host's environment is passed).
    pub env: Vec<(String, String)>,
    /// Most boxes alive at once (each has its own network namespace, cgroup and identity).
    pub max_concurrency: usize,
    /// Accept rlimit-only enforcement when cgroups are unavailable. Documented as weaker:
    /// memory becomes an address-space limit and CPU time is only counted per process.
    pub degraded: bool,
    /// Parent cgroup for a delegated cgroup v2 subtree (default: found automatically).
    pub cgroup_parent: Option<PathBuf>,
    /// First host uid/gid of the range the boxes run as (two per slot: the box user and the
    /// slot's warm interpreter).
    pub host_id_base: u32,
    /// The warm-interpreter fast path, if enabled.
    pub warm: Option<crate::warm::WarmConfig>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            limits: Limits::default(),
            network: false,
            system_paths: Vec::new(),
            binds: Vec::new(),
            env: default_env(),
            max_concurrency: default_concurrency(),
            degraded: false,
            cgroup_parent: None,
            host_id_base: DEFAULT_HOST_ID_BASE,
            warm: None,
        }
    }
}

/// Default first host id of the boxes: far above any real account, and below the 2^31
/// boundary some tools mishandle.
pub const DEFAULT_HOST_ID_BASE: u32 = 0x5A00_0000;

/// The default environment of a run.
pub fn default_env() -> Vec<(String, String)> {
    vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), WORK_DIR.into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("USER".into(), "sandbox".into()),
    ]
}

/// Default concurrency: two boxes per core, at least four.
pub fn default_concurrency() -> usize {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (cores * 2).max(4)
}

/// One run's request.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// Program and arguments; `argv[0]` is looked up in the box's `PATH` unless it has a `/`.
    pub argv: Vec<Vec<u8>>,
    /// Bytes fed to standard input (empty: `/dev/null`-like end of file).
    pub stdin: Vec<u8>,
    /// Files written into the work dir before the run: relative path and contents.
    pub files: Vec<(String, Vec<u8>)>,
    /// Relative paths of files to hand back after the run.
    pub collect: Vec<String>,
    /// Limits for this run (default: the sandbox's).
    pub limits: Option<Limits>,
    /// Working directory inside the box (absolute, or relative to the work dir).
    pub cwd: Option<String>,
    /// Environment entries added to (or replacing those of) the sandbox's base environment.
    pub env: Vec<(String, String)>,
    /// Run `/work/__main__.py` (from `files`) on the slot's warm interpreter instead of
    /// executing `argv` (which then only names the program, for messages).
    pub warm: bool,
    /// Run as a step of this session: its persistent work dir replaces the fresh one.
    pub session: Option<crate::session::Session>,
    /// Set it (from any thread) to stop the run: a queued run does not start, a live box is
    /// killed within the watch loop's 10 ms poll; either way the verdict is `sandbox_error`.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Host fds a warm run gets as its fds 3, 4, ... (at most [`MAX_PASS_FDS`]), in order:
    /// whatever they reach (a pipe, a socket) the run can use, so pass only what it may
    /// hold. Warm runs only.
    pub pass_fds: Vec<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Host fds `(stdout, stderr)` that get a copy of the run's output as it is read
    /// (see [`crate::tee`]): what the verdict keeps, in the order it was read.
    pub tee: Option<(
        std::sync::Arc<std::os::fd::OwnedFd>,
        std::sync::Arc<std::os::fd::OwnedFd>,
    )>,
}

/// The most fds a run can be given ([`RunRequest::pass_fds`]).
pub const MAX_PASS_FDS: usize = 8;

/// Checks that `s` has no NUL byte and returns it as a C string.
pub(crate) fn cstring(field: &str, s: &[u8]) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(field, "contains a NUL byte"))
}

/// Validates a relative path that must stay inside the work dir and returns its components.
pub(crate) fn relative_path(field: &str, p: &str) -> Result<Vec<String>> {
    if p.is_empty() {
        return Err(Error::invalid(field, "empty path"));
    }
    if p.as_bytes().contains(&0) {
        return Err(Error::invalid(field, format!("{p:?} contains a NUL byte")));
    }
    let path = Path::new(p);
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(Error::invalid(
                    field,
                    format!("{p:?} is absolute; give a path relative to the work dir"),
                ));
            }
            Component::ParentDir => {
                return Err(Error::invalid(field, format!("{p:?} escapes the work dir")));
            }
        }
    }
    if parts.is_empty() {
        return Err(Error::invalid(field, format!("{p:?} names no file")));
    }
    if parts.iter().any(|s| s.len() > 255) {
        return Err(Error::invalid(
            field,
            format!("{p:?} has a component longer than 255 bytes"),
        ));
    }
    Ok(parts)
}

/// Validates an absolute path inside the box (for bind targets and `cwd`).
pub(crate) fn absolute_box_path(field: &str, p: &Path) -> Result<PathBuf> {
    let bytes = p.as_os_str().as_bytes();
    if bytes.contains(&0) {
        return Err(Error::invalid(field, format!("{p:?} contains a NUL byte")));
    }
    if !p.is_absolute() {
        return Err(Error::invalid(field, format!("{p:?} must be absolute")));
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::RootDir | Component::CurDir => {}
            _ => {
                return Err(Error::invalid(
                    field,
                    format!("{p:?} must not contain '..'"),
                ))
            }
        }
    }
    Ok(out)
}

/// Validates an environment entry.
pub(crate) fn env_entry(k: &str, v: &str) -> Result<CString> {
    if k.is_empty() || k.contains('=') || k.contains('\0') {
        return Err(Error::invalid(
            "env",
            format!("invalid variable name {k:?}"),
        ));
    }
    if v.contains('\0') {
        return Err(Error::invalid(
            "env",
            format!("value of {k} contains a NUL byte"),
        ));
    }
    Ok(CString::new(format!("{k}={v}")).expect("checked for NUL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert_eq!(relative_path("f", "a/b.py").unwrap(), vec!["a", "b.py"]);
        assert_eq!(relative_path("f", "./a").unwrap(), vec!["a"]);
        assert!(relative_path("f", "/etc/passwd").is_err());
        assert!(relative_path("f", "../x").is_err());
        assert!(relative_path("f", "a/../../x").is_err());
        assert!(relative_path("f", "").is_err());
        assert!(relative_path("f", ".").is_err());
        assert!(relative_path("f", "a\0b").is_err());
    }

    #[test]
    fn absolute_paths() {
        assert_eq!(
            absolute_box_path("cwd", Path::new("/work/x/")).unwrap(),
            PathBuf::from("/work/x")
        );
        assert!(absolute_box_path("cwd", Path::new("work")).is_err());
        assert!(absolute_box_path("cwd", Path::new("/work/../etc")).is_err());
    }

    #[test]
    fn env_entries() {
        assert_eq!(env_entry("A", "b=c").unwrap().as_bytes(), b"A=b=c");
        assert!(env_entry("A=B", "c").is_err());
        assert!(env_entry("", "c").is_err());
        assert!(env_entry("A", "c\0").is_err());
    }
}
