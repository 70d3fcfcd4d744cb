//! [`CgroupView`]: what the box sees under `/sys/fs/cgroup` on cgroup v1, from the host's
//! mountinfo and the slot's cgroup directories.

use std::path::{Path, PathBuf};

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
    pub(super) binds: Vec<(PathBuf, PathBuf)>,
    /// (symlink target, box path of the link).
    pub(super) links: Vec<(PathBuf, PathBuf)>,
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
    /// On v1, the calling thread's own cgroups of `V1_SHARED` hierarchies the slot has no
    /// directory in are added (from `/proc/thread-self/cgroup`): they are the box's cgroups
    /// there.
    pub fn new(dirs: &[PathBuf]) -> CgroupView {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap_or_default();
        Self::from_host(dirs, &mountinfo, &own)
    }

    pub(super) fn from_host(dirs: &[PathBuf], mountinfo: &str, own_cgroup: &str) -> CgroupView {
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
pub(super) fn unescape_mountinfo(s: &str) -> String {
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
