//! The box's file system: what it sees, and how that view is built.
//!
//! Built in two stages so that a run costs as little as possible:
//!
//! 1. **Per slot, once** ([`Template::build`], on the slot's own thread, which has unshared
//!    `CLONE_FS | CLONE_NEWNS` and so owns a private mount namespace nobody else sees): a small
//!    read-only tmpfs becomes the future root. It holds the directory skeleton, `/etc`
//!    (generated `passwd`/`group`/`hostname`/`hosts`/`mtab`, and copies of the host's
//!    non-secret configuration on an explicit allowlist, [`ETC_ALLOW`]), `/dev` placeholders
//!    with the host's `null`, `zero`, `full`, `random` and `urandom` bound over them (and
//!    `/dev/ptmx -> pts/ptmx`), `/sys/fs/cgroup` (nothing else of `/sys`: on v1 read-only binds of the
//!    box's own cgroup directories, [`CgroupView`]; on v2 an empty directory, over which each
//!    box mounts a read-only cgroup2 of its own once it has its cgroup namespace), and read-only recursive binds of
//!    `/usr`, the `/bin`/`/lib*` directories (or the same symlinks where the host has merged
//!    `/usr`), the interpreters' prefixes at their own paths, and the caller's extra binds.
//!    Bind sources are
//!    cloned with `open_tree` *before* the template is attached, so no source can be hidden by
//!    the attachment point.
//! 2. **Per run**: the parent makes a fresh size-limited tmpfs with `fsopen`/`fsmount` (it is
//!    attached nowhere on the host), creates `work/`, `tmp/` and `shm/` in it and writes the
//!    input files. The child, whose new mount namespace is a copy of the slot's, moves that
//!    tmpfs to `/.run` of the template (its root is mode 0711 and owned by host root: the box
//!    can neither list nor change it, and what it holds is what `/work`, `/tmp` and `/dev/shm`
//!    already show), binds its three directories over `/work`, `/tmp` and
//!    `/dev/shm`, mounts a fresh `/proc` for its pid namespace (with `/proc/sys` read-only)
//!    and a devpts instance of its own at `/dev/pts` (no run sees another's terminals), and
//!    `pivot_root`s into the template, detaching everything of the host. After the run the
//!    parent still holds the tmpfs through its mount fd and reads the collected files from it
//!    with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`; closing the fd frees it.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::config::{Bind, SandboxConfig};
use crate::error::{Error, Result};

/// Inside uid and gid of the box's user.
pub const BOX_ID: u32 = 1000;

const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const OPEN_TREE_CLONE: u32 = 1;
const OPEN_TREE_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const AT_RECURSIVE: u32 = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn c(p: &[u8]) -> CString {
    CString::new(p).expect("paths are checked for NUL before they reach here")
}

fn cpath(p: &Path) -> CString {
    c(p.as_os_str().as_bytes())
}

/// Gives the calling thread a mount namespace of its own whose mounts are all private
/// (`CLONE_FS` too: a thread that shares its fs_struct may not change mount namespace).
/// `whose` names the thread in errors.
pub(crate) fn private_mount_namespace(whose: &str) -> crate::error::Result<()> {
    // SAFETY: unshare affects only this thread's fs and mount namespace.
    if unsafe { libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS) } < 0 {
        return Err(Error::setup_io(
            format!("unsharing the {whose} mount namespace"),
            io::Error::last_os_error(),
        ));
    }
    let root = c"/";
    // SAFETY: mount with NULL source/type/data and a valid path.
    if unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    } < 0
    {
        return Err(Error::setup_io(
            format!("making the {whose} mounts private"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Creates a detached tmpfs mount with the given options and mount attributes.
pub(crate) fn new_tmpfs(options: &[(&str, String)], attrs: u64) -> io::Result<OwnedFd> {
    let name = c(b"tmpfs");
    // SAFETY: fsopen takes a NUL-terminated name and flags; it returns a new fd we own.
    let fs = unsafe {
        cvt(libc::syscall(
            libc::SYS_fsopen,
            name.as_ptr(),
            libc::FSOPEN_CLOEXEC,
        ))?
    };
    // SAFETY: fs is a valid fd just returned by fsopen and owned by nobody else.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    for (k, v) in options {
        let (k, v) = (c(k.as_bytes()), c(v.as_bytes()));
        // SAFETY: fs is a valid fs-context fd; key and value are NUL-terminated strings.
        unsafe {
            cvt(libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            ))?;
        }
    }
    // SAFETY: as above, with no key or value.
    unsafe {
        cvt(libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
        ))?
    };
    // SAFETY: fsmount on a created fs context; returns a new mount fd we own.
    let m = unsafe {
        cvt(libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attrs,
        ))?
    };
    // SAFETY: m is a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(m as RawFd) })
}

/// Clones the mount tree at `path` into a detached mount (`open_tree(OPEN_TREE_CLONE)`) and
/// sets `attrs` on it (recursively when `recursive`).
fn clone_tree(path: &Path, recursive: bool, attrs: u64) -> io::Result<OwnedFd> {
    let p = cpath(path);
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: p is NUL-terminated; the returned fd is new and ours.
    let fd = unsafe {
        cvt(libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            p.as_ptr(),
            flags,
        ))?
    };
    // SAFETY: fd is a fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    set_attrs(fd.as_fd(), recursive, attrs)?;
    Ok(fd)
}

use std::os::fd::AsFd;

/// `mount_setattr` on the mount an fd refers to.
fn set_attrs(fd: BorrowedFd<'_>, recursive: bool, attrs: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = c(b"");
    let flags = libc::AT_EMPTY_PATH as u32 | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: fd is valid; attr is a properly laid out mount_attr and its size is passed.
    unsafe {
        cvt(libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ))?;
    }
    Ok(())
}

/// Attaches a detached mount at `target` (`move_mount`).
fn attach(fd: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let empty = c(b"");
    let t = cpath(target);
    // SAFETY: both strings are NUL-terminated; fd is a valid mount fd.
    unsafe {
        cvt(libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ))?;
    }
    Ok(())
}

/// `mkdirat` that tolerates an existing directory.
pub(crate) fn mkdirat(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let n = c(name);
    // SAFETY: dir is a valid directory fd and n NUL-terminated.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), n.as_ptr(), mode) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// Creates (or truncates) a regular file under `dir` and writes `data` to it.
pub(crate) fn write_file_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    data: &[u8],
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let n = c(name);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: dir is valid, n NUL-terminated; the fd returned is ours.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), n.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    write_all(unsafe { OwnedFd::from_raw_fd(fd) }, data)
}

/// Writes all of `data` to `fd` (retrying short writes and `EINTR`) and gives the fd back.
pub(crate) fn write_all(fd: OwnedFd, data: &[u8]) -> io::Result<OwnedFd> {
    let mut file = std::fs::File::from(fd);
    io::Write::write_all(&mut file, data)?;
    Ok(OwnedFd::from(file))
}

/// Opens `name` under `dir` as a directory (`O_PATH` not used: we need to create in it).
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    let n = c(name);
    // SAFETY: valid dir fd and NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            n.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn symlinkat(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (t, n) = (c(target), c(name));
    // SAFETY: valid strings and dir fd.
    if unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), n.as_ptr()) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// One entry of the root skeleton.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A read-only (or writable) recursive bind of a host directory or file.
    Bind {
        source: PathBuf,
        target: PathBuf,
        writable: bool,
        is_dir: bool,
    },
    /// A symlink, replicated from the host's merged-/usr layout.
    Symlink { target: PathBuf, link: PathBuf },
    /// A host device node bound read-write.
    Device { source: PathBuf, target: PathBuf },
}

/// What the box's root is made of, discovered once per sandbox.
#[derive(Debug, Clone)]
pub struct Layout {
    entries: Vec<Entry>,
    /// The extension module's bytes, for the warm interpreter (read once per sandbox).
    core_module: Option<std::sync::Arc<Vec<u8>>>,
    etc_files: Vec<(PathBuf, EtcItem)>,
    network: bool,
}

#[derive(Debug, Clone)]
enum EtcItem {
    Data(Vec<u8>),
    Symlink(PathBuf),
    /// An empty directory.
    Dir,
}

const SYSTEM_DIRS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// What of the host's `/etc` the box sees (copied into the template once per slot, so it
/// costs nothing per run): the non-secret configuration that runtimes read. An entry the host
/// lacks is skipped; a name ending in `*` matches every entry of `/etc` it prefixes.
/// Directories are copied whole (symlinks as symlinks), except what [`etc_secret`] refuses.
/// `passwd`, `group`, `hostname`, `hosts` (without network) and `mtab` are generated instead.
///
/// Without network, `/etc/hosts` is the host's lines for `localhost` and its kin (so
/// `localhost` resolves in the box exactly as on the host: to 127.0.0.1 only, or to ::1
/// too) and the box's own name; other lines name the host or addresses the box cannot
/// reach, and are left out.
fn loopback_hosts(host: &str) -> String {
    let mut out = String::new();
    for line in host.lines() {
        let entry = line.split('#').next().unwrap_or("");
        let mut fields = entry.split_whitespace();
        let loopback = fields
            .next()
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
            .is_some_and(|a| a.is_loopback());
        let local = fields.any(|n| n.contains("localhost") || n.contains("loopback"));
        if loopback && local {
            out.push_str(entry.trim_end());
            out.push('\n');
        }
    }
    if !out.split_whitespace().any(|w| w == "localhost") {
        out.push_str("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    }
    out.push_str("127.0.1.1\tsandbox\n");
    out
}
pub const ETC_ALLOW: &[&str] = &[
    // The dynamic loader.
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    // Name service and network databases (files only: there is no network to ask).
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "services",
    "protocols",
    "networks",
    "ethertypes",
    "rpc",
    // The system's identity, read by `platform`, package managers and build tools.
    "os-release",
    "lsb-release",
    "debian_version",
    "redhat-release",
    "system-release",
    "alpine-release",
    "issue",
    // Time and locale.
    "localtime",
    "timezone",
    "locale.alias",
    "locale.conf",
    "default/locale",
    // TLS: the public CA certificates and OpenSSL's configuration, never `ssl/private`.
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/tls/openssl.cnf",
    "pki/ca-trust/extracted",
    "pki/ca-trust/source/anchors",
    "pki/java",
    "crypto-policies",
    // Runtimes: Debian's alternatives links, the JDK's configuration, Python's, fonts.
    "alternatives",
    "java*",
    "python3*",
    "perl",
    "fonts",
    "mime.types",
    "magic",
    "magic.mime",
    // Shells and terminals.
    "shells",
    "profile",
    "bash.bashrc",
    "inputrc",
    "terminfo",
];
/// Entries that only a box with the host's network gets.
const ETC_ALLOW_NETWORK: &[&str] = &["resolv.conf"];
/// Name fragments that are never copied from `/etc`, wherever they appear: private keys,
/// password hashes, sudo rules, ssh host keys and credential stores.
const ETC_SECRET: &[&str] = &[
    "private",
    "shadow",
    "sudoers",
    "ssh",
    "secret",
    "credential",
    ".key",
    "keytab",
    "token",
];
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];
/// Devices bound when the host has them: `/dev/tty` opens its opener's controlling terminal,
/// which in a box can only be a terminal of its own devpts (a box starts without one: ENXIO).
const OPTIONAL_DEVICES: &[&str] = &["tty"];

impl Layout {
    /// Looks at the host and the configuration and decides the skeleton.
    pub fn discover(config: &SandboxConfig) -> Result<Layout> {
        let mut entries = Vec::new();
        let usr = Path::new("/usr");
        if !usr.is_dir() {
            return Err(Error::setup("/usr is not a directory on this host"));
        }
        entries.push(Entry::Bind {
            source: usr.into(),
            target: usr.into(),
            writable: false,
            is_dir: true,
        });
        for d in SYSTEM_DIRS {
            let p = Path::new(d);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    let t = std::fs::read_link(p)
                        .map_err(|e| Error::setup_io(format!("readlink {d}"), e))?;
                    entries.push(Entry::Symlink {
                        target: t,
                        link: p.into(),
                    });
                }
                Ok(m) if m.is_dir() => entries.push(Entry::Bind {
                    source: p.into(),
                    target: p.into(),
                    writable: false,
                    is_dir: true,
                }),
                _ => {}
            }
        }
        // Interpreter prefixes and other system paths, deduplicated against what is covered.
        let mut extra: Vec<PathBuf> = Vec::new();
        for p in &config.system_paths {
            let p = crate::config::absolute_box_path("system_paths", p)?;
            let real = std::fs::canonicalize(&p).unwrap_or(p.clone());
            for q in [p, real] {
                if !q.exists() {
                    continue;
                }
                if extra.iter().any(|e| q.starts_with(e)) || q.starts_with("/usr") {
                    continue;
                }
                extra.retain(|e| !e.starts_with(&q));
                extra.push(q);
            }
        }
        for p in extra {
            if p == Path::new("/") || forbidden_target(&p) {
                return Err(Error::invalid(
                    "system_paths",
                    format!("{} cannot be bound into the box", p.display()),
                ));
            }
            let is_dir = p.is_dir();
            entries.push(Entry::Bind {
                source: p.clone(),
                target: p,
                writable: false,
                is_dir,
            });
        }
        for Bind {
            source,
            target,
            writable,
        } in &config.binds
        {
            let target = crate::config::absolute_box_path("binds", target)?;
            if target == Path::new("/") || forbidden_target(&target) {
                return Err(Error::invalid(
                    "binds",
                    format!("cannot bind over {} inside the box", target.display()),
                ));
            }
            let meta = std::fs::metadata(source).map_err(|e| {
                Error::invalid("binds", format!("source {}: {e}", source.display()))
            })?;
            entries.push(Entry::Bind {
                source: source.clone(),
                target,
                writable: *writable,
                is_dir: meta.is_dir(),
            });
        }
        for d in DEVICES {
            let p = PathBuf::from(format!("/dev/{d}"));
            if !p.exists() {
                return Err(Error::setup(format!(
                    "{} is missing on the host",
                    p.display()
                )));
            }
            entries.push(Entry::Device {
                source: p.clone(),
                target: p,
            });
        }
        for d in OPTIONAL_DEVICES {
            let p = PathBuf::from(format!("/dev/{d}"));
            if p.exists() {
                entries.push(Entry::Device {
                    source: p.clone(),
                    target: p,
                });
            }
        }
        let mut etc_files = Vec::new();
        let mut names: Vec<String> = Vec::new();
        let etc_entries: Vec<String> = std::fs::read_dir("/etc")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let allow = ETC_ALLOW.iter().chain(if config.network {
            ETC_ALLOW_NETWORK
        } else {
            &[]
        });
        for pattern in allow {
            match pattern.strip_suffix('*') {
                Some(prefix) => {
                    let mut matched: Vec<&String> = etc_entries
                        .iter()
                        .filter(|e| e.starts_with(prefix))
                        .collect();
                    matched.sort();
                    names.extend(matched.into_iter().cloned());
                }
                None => names.push((*pattern).to_string()),
            }
        }
        for name in names {
            collect_etc(
                Path::new("/etc").join(&name),
                PathBuf::from(&name),
                0,
                &mut etc_files,
            );
        }
        let core_module = match &config.warm {
            Some(w) => Some(std::sync::Arc::new(std::fs::read(&w.core_module).map_err(
                |e| {
                    Error::setup_io(
                        format!("reading the extension module {}", w.core_module.display()),
                        e,
                    )
                },
            )?)),
            None => None,
        };
        Ok(Layout {
            entries,
            core_module,
            etc_files,
            network: config.network,
        })
    }
}

/// Box paths that the sandbox builds itself and a bind must not replace.
fn forbidden_target(p: &Path) -> bool {
    ["/proc", "/dev", "/sys", "/work", "/tmp", "/etc", "/.run"]
        .iter()
        .any(|f| p == Path::new(f) || p.starts_with(format!("{f}/")))
        || p.starts_with("/proc")
}

/// Whether a path under `/etc` (relative) must never reach the box, by name (see
/// [`ETC_SECRET`]).
fn etc_secret(rel: &Path) -> bool {
    let s = rel.to_string_lossy().to_ascii_lowercase();
    ETC_SECRET.iter().any(|f| s.contains(f))
}

/// Copies `host` (a file, a symlink or a directory, recursively) into `out` as `rel`, except
/// a secret by name ([`etc_secret`]), anything an unprivileged host user could not read
/// (a file without `o+r`, a directory without `o+rx`) and files over 4 MiB.
fn collect_etc(host: PathBuf, rel: PathBuf, depth: u32, out: &mut Vec<(PathBuf, EtcItem)>) {
    use std::os::unix::fs::PermissionsExt;
    if etc_secret(&rel) {
        return;
    }
    let Ok(meta) = std::fs::symlink_metadata(&host) else {
        return;
    };
    let mode = meta.permissions().mode();
    if meta.file_type().is_symlink() {
        if let Ok(t) = std::fs::read_link(&host) {
            out.push((rel, EtcItem::Symlink(t)));
        }
    } else if meta.is_file() && meta.len() <= 4 << 20 && mode & 0o004 != 0 {
        if let Ok(data) = std::fs::read(&host) {
            out.push((rel, EtcItem::Data(data)));
        }
    } else if meta.is_dir() && depth < 8 && mode & 0o005 == 0o005 {
        if let Ok(rd) = std::fs::read_dir(&host) {
            let mut children: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
            children.sort();
            if children.is_empty() {
                out.push((rel.clone(), EtcItem::Dir));
            }
            for name in children {
                collect_etc(host.join(&name), rel.join(&name), depth + 1, out);
            }
        }
    }
}

/// What the box sees under `/sys/fs/cgroup` on cgroup v1 (on v2 each box mounts a cgroup2 view
/// of its own, which follows its cgroup: a cold run may have one apart from its slot's): its
/// own cgroup directories, laid out as on the host (v2: the slot's directory *is*
/// `/sys/fs/cgroup`; v1: each hierarchy's slot directory
/// at the hierarchy's own name, e.g. `/sys/fs/cgroup/memory`, with the host's links for
/// co-mounted controllers, e.g. `cpuacct -> cpu,cpuacct`). The box's cgroup namespace is
/// rooted at those directories, so `/proc/self/cgroup` and `/proc/self/mountinfo` say `/`
/// for them, and a runtime that looks for its limits (the JVM, `os.process_cpu_count`-like
/// code, Go) finds the box's.
#[derive(Debug, Default, Clone)]
pub struct CgroupView {
    /// (host cgroup directory, box path).
    binds: Vec<(PathBuf, PathBuf)>,
    /// (symlink target, box path of the link).
    links: Vec<(PathBuf, PathBuf)>,
}

/// One cgroup mount of the host, from `/proc/self/mountinfo`.
struct CgroupMount {
    point: PathBuf,
    /// The mount's root within its hierarchy.
    root: PathBuf,
    v2: bool,
    /// v1: the controllers (and `name=`) in its super options.
    controllers: Vec<String>,
}

/// v1 controllers the box also sees although the slot has no directory of its own there (it
/// lives in the sandbox process's cgroup of those hierarchies): the JVM accepts a v1 host only
/// when `cpuset`, `cpu`, `cpuacct` and `memory` are all mounted, and Go and .NET read their
/// CPU quota from `cpu`.
const V1_SHARED: &[&str] = &["cpu", "cpuset", "cpuacct"];

impl CgroupView {
    /// The view of the slot cgroup directories `dirs`, placed by the cgroup mount each one is
    /// under (from `/proc/self/mountinfo`); a directory under no cgroup mount is left out.
    /// On v1, the calling thread's own cgroups of [`V1_SHARED`] hierarchies the slot has no
    /// directory in are added (from `/proc/thread-self/cgroup`): they are the box's cgroups
    /// there.
    pub fn new(dirs: &[PathBuf]) -> CgroupView {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap_or_default();
        Self::from_host(dirs, &mountinfo, &own)
    }

    fn from_host(dirs: &[PathBuf], mountinfo: &str, own_cgroup: &str) -> CgroupView {
        let mounts: Vec<CgroupMount> = mountinfo
            .lines()
            .filter_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let mut f = left.split(' ');
                let root = f.nth(3)?;
                let point = f.next()?;
                let mut r = right.split(' ');
                let fstype = r.next()?;
                let options = r.nth(1).unwrap_or("");
                (fstype == "cgroup" || fstype == "cgroup2").then(|| CgroupMount {
                    point: PathBuf::from(unescape_mountinfo(point)),
                    root: PathBuf::from(unescape_mountinfo(root)),
                    v2: fstype == "cgroup2",
                    controllers: options.split(',').map(str::to_string).collect(),
                })
            })
            .collect();
        let mut view = CgroupView::default();
        let base = Path::new("/sys/fs/cgroup");
        let mut used: Vec<&CgroupMount> = Vec::new();
        let add = |view: &mut CgroupView, dir: &Path, m: &CgroupMount| {
            let Some(name) = m.point.file_name() else {
                return;
            };
            view.binds.push((dir.to_path_buf(), base.join(name)));
            let name = name.to_string_lossy();
            if name.contains(',') {
                for ctrl in name.split(',') {
                    view.links.push((PathBuf::from(&*name), base.join(ctrl)));
                }
            }
        };
        for dir in dirs {
            let Some(m) = mounts
                .iter()
                .filter(|m| dir.starts_with(&m.point))
                .max_by_key(|m| m.point.as_os_str().len())
            else {
                continue;
            };
            if m.v2 {
                view.binds.push((dir.clone(), base.into()));
                return view;
            }
            add(&mut view, dir, m);
            used.push(m);
        }
        if used.is_empty() {
            return view;
        }
        for ctrl in V1_SHARED {
            if used.iter().any(|m| m.controllers.iter().any(|c| c == ctrl)) {
                continue;
            }
            let Some(m) = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == ctrl))
            else {
                continue;
            };
            // "4:cpu,cpuacct:/some/path"
            let Some(path) = own_cgroup.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, list, path) = (f.next()?, f.next()?, f.next()?);
                list.split(',').any(|c| c == *ctrl).then_some(path)
            }) else {
                continue;
            };
            let path = Path::new(path);
            let rel = path
                .strip_prefix(&m.root)
                .or_else(|_| path.strip_prefix("/"))
                .unwrap_or(path);
            let dir = m.point.join(rel);
            if dir.is_dir() {
                add(&mut view, &dir, m);
                used.push(m);
            }
        }
        view
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The slot's root skeleton, attached at `mountpoint` in the slot thread's private mount
/// namespace.
pub struct Template {
    /// Where the template is attached in the slot's mount namespace.
    pub mountpoint: PathBuf,
}

/// Candidate attachment points: any existing directory works, since the slot's namespace is
/// private and all bind sources are cloned before the template covers it.
const MOUNTPOINTS: &[&str] = &["/tmp", "/mnt", "/var/tmp", "/run", "/opt", "/srv", "/home"];

impl Template {
    /// Builds the template. Must run on a thread that has its own mount namespace.
    /// `cgroups` are the slot's cgroup directories (see [`CgroupView`]), shown read-only
    /// under `/sys/fs/cgroup`.
    pub fn build(layout: &Layout, cgroups: &CgroupView) -> Result<Template> {
        let err = |what: String| move |e: io::Error| Error::setup_io(what, e);
        // 1. Clone every bind source before anything is attached.
        let mut clones = Vec::new();
        for (source, target) in &cgroups.binds {
            let fd = clone_tree(
                source,
                false,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )
            .map_err(err(format!("cloning the slot cgroup {}", source.display())))?;
            clones.push((fd, target.clone(), true));
        }
        for e in &layout.entries {
            match e {
                Entry::Bind {
                    source,
                    target,
                    writable,
                    is_dir,
                } => {
                    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
                    if !writable {
                        attrs |= MOUNT_ATTR_RDONLY;
                    }
                    let fd = clone_tree(source, true, attrs)
                        .map_err(err(format!("cloning bind source {}", source.display())))?;
                    clones.push((fd, target.clone(), *is_dir));
                }
                Entry::Device { source, target } => {
                    let fd = clone_tree(source, false, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)
                        .map_err(err(format!("cloning device {}", source.display())))?;
                    clones.push((fd, target.clone(), false));
                }
                Entry::Symlink { .. } => {}
            }
        }
        // 2. The skeleton tmpfs.
        let etc_bytes: usize = layout
            .etc_files
            .iter()
            .map(|(_, item)| match item {
                EtcItem::Data(d) => d.len() + 4096,
                _ => 4096,
            })
            .sum();
        let size_mb = 16
            + (etc_bytes >> 20)
            + layout
                .core_module
                .as_ref()
                .map(|m| m.len() >> 20)
                .unwrap_or(0);
        let root = new_tmpfs(
            &[("size", format!("{size_mb}m")), ("mode", "0755".into())],
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )
        .map_err(err(
            "creating the root tmpfs (fsopen/fsmount; Linux 5.2+ needed)".into(),
        ))?;
        let rootdir =
            open_dir_at(root.as_fd(), b".").map_err(err("opening the root tmpfs".into()))?;
        let d = rootdir.as_fd();
        for name in [
            "dev",
            "proc",
            "sys",
            "sys/fs",
            "sys/fs/cgroup",
            "tmp",
            "work",
            "etc",
            ".run",
            "root",
            "home",
            "dev/shm",
            "dev/pts",
        ] {
            mkdirat(d, name.as_bytes(), 0o755).map_err(err(format!("mkdir /{name}")))?;
        }
        for (t, l) in [
            ("/proc/self/fd", "dev/fd"),
            ("/proc/self/fd/0", "dev/stdin"),
            ("/proc/self/fd/1", "dev/stdout"),
            ("/proc/self/fd/2", "dev/stderr"),
            ("pts/ptmx", "dev/ptmx"),
            ("../proc/self/mounts", "etc/mtab"),
        ] {
            symlinkat(t.as_bytes(), d, l.as_bytes()).map_err(err(format!("symlink /{l}")))?;
        }
        for e in &layout.entries {
            if let Entry::Symlink { target, link } = e {
                symlinkat(target.as_os_str().as_bytes(), d, rel(link))
                    .map_err(err(format!("symlink {}", link.display())))?;
            }
        }
        for (target, link) in &cgroups.links {
            symlinkat(target.as_os_str().as_bytes(), d, rel(link))
                .map_err(err(format!("symlink {}", link.display())))?;
        }
        for (fd, target, is_dir) in &clones {
            let r = rel(target);
            make_parents(d, r).map_err(err(format!(
                "creating the mount point {}",
                target.display()
            )))?;
            if *is_dir {
                mkdirat(d, r, 0o755).map_err(err(format!("mkdir {}", target.display())))?;
            } else {
                write_file_at(d, r, b"", 0o644)
                    .map_err(err(format!("creating {}", target.display())))?;
            }
            let _ = fd;
        }
        // /etc: generated identity files and copies of the loader's configuration.
        let passwd = format!(
            "root:x:0:0:root:/root:/bin/sh\nsandbox:x:{BOX_ID}:{BOX_ID}:sandbox:/work:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        );
        let group = format!("root:x:0:\nsandbox:x:{BOX_ID}:\nnogroup:x:65534:\n");
        let hosts = loopback_hosts(&std::fs::read_to_string("/etc/hosts").unwrap_or_default());
        let mut generated: Vec<(&str, Vec<u8>)> = vec![
            ("etc/passwd", passwd.into_bytes()),
            ("etc/group", group.into_bytes()),
            ("etc/hostname", b"sandbox\n".to_vec()),
        ];
        if !layout.network {
            generated.push(("etc/hosts", hosts.into_bytes()));
        }
        for (rel_path, item) in &layout.etc_files {
            let p = Path::new("etc").join(rel_path);
            let pb = p.as_os_str().as_bytes();
            make_parents(d, pb).map_err(err(format!("mkdir for /{}", p.display())))?;
            match item {
                EtcItem::Data(data) => {
                    write_file_at(d, pb, data, 0o644)
                        .map_err(err(format!("writing /{}", p.display())))?;
                }
                EtcItem::Symlink(t) => {
                    symlinkat(t.as_os_str().as_bytes(), d, pb)
                        .map_err(err(format!("symlink /{}", p.display())))?;
                }
                EtcItem::Dir => {
                    mkdirat(d, pb, 0o755).map_err(err(format!("mkdir /{}", p.display())))?;
                }
            }
        }
        if layout.network {
            if let Ok(h) = std::fs::read("/etc/hosts") {
                generated.push(("etc/hosts", h));
            }
        }
        // The box's init (see `crate::init`).
        let init_rel = rel(Path::new(crate::init::PATH));
        make_parents(d, init_rel).map_err(err("creating /.agentrl".into()))?;
        write_file_at(d, init_rel, &crate::init::elf(), 0o755)
            .map_err(err("writing the init".into()))?;
        write_file_at(
            d,
            rel(Path::new(crate::init::IDLE_PATH)),
            &crate::init::idle_elf(),
            0o755,
        )
        .map_err(err("writing the idle init".into()))?;
        // The warm interpreter's copy of the extension module (copied, not bound: a bind would
        // show its host path in the box's mountinfo).
        if let Some(module) = &layout.core_module {
            let rel_path = rel(Path::new(crate::zygote::CORE_MODULE_IN_BOX));
            make_parents(d, rel_path).map_err(err("creating /.agentrl".into()))?;
            write_file_at(d, rel_path, module, 0o755)
                .map_err(err("copying the extension module".into()))?;
        }
        for (name, data) in generated {
            write_file_at(d, name.as_bytes(), &data, 0o644)
                .map_err(err(format!("writing /{name}")))?;
        }
        drop(rootdir);
        // 3. Attach the skeleton and move the clones into it.
        let mountpoint = MOUNTPOINTS
            .iter()
            .map(PathBuf::from)
            .find(|p| {
                std::fs::symlink_metadata(p)
                    .map(|m| m.is_dir())
                    .unwrap_or(false)
            })
            .ok_or_else(|| {
                Error::setup("no directory to attach the box root at (tried /tmp, /mnt, ...)")
            })?;
        attach(root.as_fd(), &mountpoint).map_err(err(format!(
            "attaching the root at {}",
            mountpoint.display()
        )))?;
        for (fd, target, _) in &clones {
            let at = mountpoint.join(rel_path(target));
            attach(fd.as_fd(), &at).map_err(err(format!("binding {}", target.display())))?;
        }
        // The skeleton itself becomes read-only; binds keep their own attributes. While
        // another slot starts a box, its child (a clone of this process, until it closes its
        // fds or executes) may still hold a file this thread wrote above: the skeleton then
        // has a writer, and the kernel answers EBUSY until the child lets go, within
        // milliseconds.
        let mp = open_path(&mountpoint).map_err(err("opening the root".into()))?;
        crate::retry::while_busy(std::time::Duration::from_secs(5), || {
            set_attrs(
                mp.as_fd(),
                false,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            )
        })
        .map_err(err(
            "making the root read-only (mount_setattr; Linux 5.12+ needed)".into(),
        ))?;
        Ok(Template { mountpoint })
    }
}

fn open_path(p: &Path) -> io::Result<OwnedFd> {
    let cp = cpath(p);
    // SAFETY: NUL-terminated path; returns a fresh fd.
    let fd = unsafe {
        libc::open(
            cp.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn rel(p: &Path) -> &[u8] {
    let b = p.as_os_str().as_bytes();
    let mut i = 0;
    while i < b.len() && b[i] == b'/' {
        i += 1;
    }
    &b[i..]
}

fn rel_path(p: &Path) -> &Path {
    p.strip_prefix("/").unwrap_or(p)
}

/// Creates every parent directory of `path` (relative to `dir`).
pub(crate) fn make_parents(dir: BorrowedFd<'_>, path: &[u8]) -> io::Result<()> {
    let mut i = 0;
    while let Some(j) = path[i..].iter().position(|&b| b == b'/') {
        let end = i + j;
        if end > 0 {
            mkdirat(dir, &path[..end], 0o755)?;
        }
        i = end + 1;
    }
    Ok(())
}

/// Paths the child uses, all under the template's mount point, built once per slot.
pub struct ChildPaths {
    pub root: CString,
    pub run: CString,
    pub run_work: CString,
    pub run_tmp: CString,
    pub run_shm: CString,
    pub work: CString,
    pub tmp: CString,
    pub shm: CString,
    pub proc_: CString,
    pub proc_sys: CString,
    /// `/dev/pts`, where each box mounts its own devpts instance.
    pub pts: CString,
}

impl ChildPaths {
    pub fn new(mountpoint: &Path) -> ChildPaths {
        let j = |s: &str| cpath(&mountpoint.join(s));
        ChildPaths {
            root: cpath(mountpoint),
            run: j(".run"),
            run_work: j(".run/work"),
            run_tmp: j(".run/tmp"),
            run_shm: j(".run/shm"),
            work: j("work"),
            tmp: j("tmp"),
            shm: j("dev/shm"),
            proc_: j("proc"),
            proc_sys: j("proc/sys"),
            pts: j("dev/pts"),
        }
    }
}

/// The per-run tmpfs that holds `/work`, `/tmp` and `/dev/shm`.
pub struct RunFs {
    /// Detached mount fd (the child moves it into its namespace; we keep reading through it).
    pub mount: OwnedFd,
    root: OwnedFd,
}

impl RunFs {
    /// Creates the tmpfs, its three directories owned by the box user, and the input files.
    pub fn new(
        size: u64,
        host_uid: u32,
        host_gid: u32,
        files: &[(Vec<String>, Vec<u8>)],
    ) -> io::Result<RunFs> {
        let fs = RunFs::empty(size, host_uid, host_gid)?;
        fs.write_inputs(files, host_uid, host_gid)?;
        Ok(fs)
    }

    /// Creates the tmpfs and its three directories owned by the box user.
    pub fn empty(size: u64, host_uid: u32, host_gid: u32) -> io::Result<RunFs> {
        let inodes = (size / 4096).clamp(1024, 1 << 20);
        let mount = new_tmpfs(
            &[
                ("size", size.to_string()),
                ("nr_inodes", inodes.to_string()),
                ("mode", "0711".into()),
            ],
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )?;
        let root = open_dir_at(mount.as_fd(), b".")?;
        for (name, mode) in [(&b"work"[..], 0o755), (b"tmp", 0o1777), (b"shm", 0o1777)] {
            mkdirat(root.as_fd(), name, mode)?;
            chown_at(root.as_fd(), name, host_uid, host_gid)?;
            // mkdir applies the umask; set the mode exactly.
            chmod_at(root.as_fd(), name, mode)?;
        }
        Ok(RunFs { mount, root })
    }

    /// Writes the input files into `work/`, owned by the box user.
    pub fn write_inputs(
        &self,
        files: &[(Vec<String>, Vec<u8>)],
        uid: u32,
        gid: u32,
    ) -> io::Result<()> {
        for (parts, data) in files {
            self.write_input(parts, data, uid, gid)?;
        }
        Ok(())
    }

    fn write_input(&self, parts: &[String], data: &[u8], uid: u32, gid: u32) -> io::Result<()> {
        let mut path = b"work".to_vec();
        for (i, p) in parts.iter().enumerate() {
            path.push(b'/');
            path.extend_from_slice(p.as_bytes());
            if i + 1 < parts.len() {
                mkdirat(self.root.as_fd(), &path, 0o755)?;
                chown_at(self.root.as_fd(), &path, uid, gid)?;
            }
        }
        let fd = write_file_at(self.root.as_fd(), &path, data, 0o644)?;
        // SAFETY: fd is a valid open file.
        if unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads a file the run left in its work dir, never following a symlink and never leaving
    /// the tmpfs. Returns `None` when there is no such regular file; the bool says truncated.
    pub fn collect(&self, parts: &[String], cap: u64) -> Option<(Vec<u8>, bool)> {
        collect_at(self.root.as_fd(), b"work", parts, cap)
    }

    /// The root directory fd of the tmpfs.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }
}

/// Reads `prefix/parts...` under `dir` without following any symlink or leaving `dir`.
/// Returns `None` unless it is a regular file; the bool says it was cut at `cap`.
pub fn collect_at(
    dir: BorrowedFd<'_>,
    prefix: &[u8],
    parts: &[String],
    cap: u64,
) -> Option<(Vec<u8>, bool)> {
    {
        let mut path = prefix.to_vec();
        for p in parts {
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(p.as_bytes());
        }
        let fd = openat2_beneath(dir, &path).ok()?;
        let mut st: libc::stat = unsafe_zeroed_stat();
        // SAFETY: fd is valid and st is a writable stat buffer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0
            || (st.st_mode & libc::S_IFMT) != libc::S_IFREG
        {
            return None;
        }
        let mut out = Vec::with_capacity((st.st_size as u64).min(cap) as usize);
        let mut buf = vec![0u8; 64 << 10];
        let mut truncated = false;
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return None;
            }
            if n == 0 {
                break;
            }
            let n = n as usize;
            let room = (cap as usize).saturating_sub(out.len());
            if n > room {
                out.extend_from_slice(&buf[..room]);
                truncated = true;
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        Some((out, truncated))
    }
}

fn unsafe_zeroed_stat() -> libc::stat {
    // SAFETY: libc::stat is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn chown_at(dir: BorrowedFd<'_>, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let n = c(name);
    // SAFETY: valid fd and NUL-terminated name.
    if unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            n.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn chmod_at(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let n = c(name);
    // SAFETY: valid fd and NUL-terminated name.
    if unsafe { libc::fchmodat(dir.as_raw_fd(), n.as_ptr(), mode, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const RESOLVE_NO_XDEV: u64 = 0x01;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `path` under `dir` read-only with no symlink, no magic link, no mount crossing and
/// no escape (`openat2`, Linux 5.6+).
fn openat2_beneath(dir: BorrowedFd<'_>, path: &[u8]) -> io::Result<OwnedFd> {
    let p = c(path);
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK) as u64,
        mode: 0,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
    };
    // SAFETY: valid dir fd, NUL-terminated path, open_how laid out as the kernel expects.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            p.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// For diagnostics.
pub fn describe(c: &CStr) -> String {
    c.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn v1_slot_dirs_and_the_shared_hierarchies_are_laid_out_as_on_the_host() {
        // The cpuset hierarchy's own directory does not exist here: it is left out.
        let own = "4:memory:/a/agentrl-1-0/slot-0\n1:cpu:/\n3:cpuset:/nowhere\n";
        let dirs = [
            p("/sys/fs/cgroup/memory/a/agentrl-1-0/slot-0"),
            p("/sys/fs/cgroup/pids/agentrl-1-0/slot-0"),
            p("/sys/fs/cgroup/cpuacct/agentrl-1-0/slot-0"),
        ];
        let v = CgroupView::from_host(&dirs, V1, own);
        assert_eq!(
            v.binds,
            vec![
                (dirs[0].clone(), p("/sys/fs/cgroup/memory")),
                (dirs[1].clone(), p("/sys/fs/cgroup/pids")),
                (dirs[2].clone(), p("/sys/fs/cgroup/cpuacct")),
                (p("/sys/fs/cgroup/cpu"), p("/sys/fs/cgroup/cpu")),
            ]
        );
        assert!(v.links.is_empty());
    }

    #[test]
    fn hosts_keep_the_hosts_loopback_lines_only() {
        let h = "127.0.0.1 localhost\n10.1.2.3 db.internal # a host\n::1 localhost ip6-localhost\n\
                 # comment\n127.0.1.1 myhost\n";
        assert_eq!(
            loopback_hosts(h),
            "127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.1.1\tsandbox\n"
        );
        assert!(loopback_hosts("").contains("127.0.0.1\tlocalhost\n"));
    }

    #[test]
    fn co_mounted_controllers_get_the_hosts_links() {
        let mi = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        let dirs = [
            p("/sys/fs/cgroup/memory/s"),
            p("/sys/fs/cgroup/cpu,cpuacct/s"),
        ];
        let v = CgroupView::from_host(&dirs, mi, "");
        assert_eq!(v.binds[1].1, p("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(
            v.links,
            vec![
                (p("cpu,cpuacct"), p("/sys/fs/cgroup/cpu")),
                (p("cpu,cpuacct"), p("/sys/fs/cgroup/cpuacct")),
            ]
        );
    }

    #[test]
    fn a_v2_slot_is_the_whole_of_sys_fs_cgroup_and_no_cgroup_no_view() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let dirs = [p("/sys/fs/cgroup/agentrl-1-0/slot-0")];
        let v = CgroupView::from_host(&dirs, mi, "0::/\n");
        assert_eq!(v.binds, vec![(dirs[0].clone(), p("/sys/fs/cgroup"))]);
        let v = CgroupView::from_host(&[p("/elsewhere/slot-0")], mi, "0::/\n");
        assert!(v.binds.is_empty() && v.links.is_empty());
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/a\040b\011c\134"), "/a b\tc\\");
        assert_eq!(unescape_mountinfo(r"/x\04"), r"/x\04");
    }

    #[test]
    fn secrets_of_etc_are_refused_by_name() {
        for s in [
            "shadow",
            "gshadow-",
            "sudoers.d/x",
            "ssh/ssh_host_ed25519_key",
            "ssl/private",
            "pki/tls/private/localhost.key",
            "krb5.keytab",
        ] {
            assert!(etc_secret(Path::new(s)), "{s}");
        }
        for s in [
            "ssl/certs/ca-certificates.crt",
            "os-release",
            "java-17-openjdk/security",
        ] {
            assert!(!etc_secret(Path::new(s)), "{s}");
        }
    }

    #[test]
    fn only_what_any_host_user_could_read_is_copied() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("agentrl-etc-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("conf/private")).unwrap();
        std::fs::create_dir_all(dir.join("conf/closed")).unwrap();
        std::fs::create_dir_all(dir.join("conf/empty")).unwrap();
        std::fs::write(dir.join("conf/open"), b"1").unwrap();
        std::fs::write(dir.join("conf/mine"), b"2").unwrap();
        std::fs::write(dir.join("conf/private/k"), b"3").unwrap();
        std::fs::write(dir.join("conf/closed/c"), b"4").unwrap();
        std::os::unix::fs::symlink("open", dir.join("conf/link")).unwrap();
        let mode = |p: &str, m| {
            std::fs::set_permissions(dir.join(p), std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode("conf/open", 0o644);
        mode("conf/mine", 0o600);
        mode("conf/closed", 0o750);
        let mut out = Vec::new();
        collect_etc(dir.join("conf"), p("conf"), 0, &mut out);
        let names: Vec<String> = out
            .iter()
            .map(|(r, _)| r.to_string_lossy().into_owned())
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(names, ["conf/empty", "conf/link", "conf/open"]);
    }
}
