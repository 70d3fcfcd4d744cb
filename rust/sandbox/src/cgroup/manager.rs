//! The [`Manager`]: detection of v1 or v2, the private base cgroup and the controllers it
//! needs (`cgroup.subtree_control`), and the creation of slots below it.

use std::ffi::CStr;
use std::fs;
use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::detect::{
    find_v1_mount, hidden, own_cgroup, read_mountinfo, read_self_cgroup, resolve_own,
};
use super::dirs::{remove_tree, BaseDirs, DirGuard};
use super::fake::fake_populate;
use super::files::{
    errno, is_cgroupfs, keyed_u64, open_at, open_dir, read_path, try_lock_dir, write_once,
    write_path,
};
use super::placement::{own_v2_placement, Placement};
use super::slot::{probe_v2_peak, Baseline, Slot, OOM_V1, OOM_V1_FAILCNT, OOM_V2};
use super::{
    CgroupError, PeakMemory, Version, BASE_PREFIX, CPU, DEFAULT_ROOT, MEM, NSJAIL_BASE_PREFIX,
    PIDS, V1_CONTROLLERS, V2_OPTIONAL, V2_REQUIRED,
};

/// What a manager's cgroups are for: the native backend's slots, or the nsjail backend's
/// runs ([`Manager::for_nsjail`]), whose base is named and set up as that backend's always
/// was (`agentrl-nsjail-<pid>-<n>`, only the required v2 controllers, no stale removal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Native,
    Nsjail,
}

impl Mode {
    fn base_prefix(self) -> &'static str {
        match self {
            Mode::Native => BASE_PREFIX,
            Mode::Nsjail => NSJAIL_BASE_PREFIX,
        }
    }

    fn optional(self) -> &'static [&'static str] {
        match self {
            Mode::Native => &V2_OPTIONAL,
            Mode::Nsjail => &[],
        }
    }
}

/// Makes sure the children of v2 cgroup `dir` get the required (and available `optional`)
/// controllers, writing `cgroup.subtree_control` only where something is missing.
fn ensure_controllers(dir: &Path, fake: bool, optional: &[&str]) -> Result<(), CgroupError> {
    let avail_text = read_path(&dir.join("cgroup.controllers"))?;
    let avail: Vec<&str> = avail_text.split_whitespace().collect();
    for r in V2_REQUIRED {
        if !avail.contains(&r) {
            return Err(CgroupError::msg(format!(
                "cgroup v2 controller '{r}' is not available in {} (available: '{}'); it may be \
                 bound to a cgroup v1 hierarchy, or not delegated to this subtree",
                dir.join("cgroup.controllers").display(),
                avail_text.trim()
            )));
        }
    }
    let control = dir.join("cgroup.subtree_control");
    let enabled_text = read_path(&control)?;
    let enabled: Vec<&str> = enabled_text
        .split_whitespace()
        .map(|c| c.trim_start_matches('+'))
        .collect();
    let missing_req: Vec<&str> = V2_REQUIRED
        .into_iter()
        .filter(|c| !enabled.contains(c))
        .collect();
    let missing_opt: Vec<&str> = optional
        .iter()
        .copied()
        .filter(|c| avail.contains(c) && !enabled.contains(c))
        .collect();
    let write = |list: &[&str]| {
        // A fake file does not accumulate like the kernel's, so write the union there.
        let keep: &[&str] = if fake { &enabled } else { &[] };
        let text: Vec<String> = keep.iter().chain(list).map(|c| format!("+{c}")).collect();
        write_path(&control, &text.join(" "), fake)
    };
    let all: Vec<&str> = missing_req.iter().chain(&missing_opt).copied().collect();
    if all.is_empty() {
        return Ok(());
    }
    let result = match write(&all) {
        Err(_) if !missing_opt.is_empty() && missing_req.is_empty() => Ok(()),
        Err(_) if !missing_opt.is_empty() => write(&missing_req),
        r => r,
    };
    result.map_err(|e| {
        let why = match errno(&e) {
            libc::EBUSY => {
                "the cgroup has processes, and cgroup v2 forbids enabling controllers for the \
                 children of a cgroup with processes ('no internal processes' rule); pass a \
                 parent cgroup without processes (e.g. a delegated subtree)"
            }
            libc::EACCES | libc::EPERM | libc::EROFS => {
                "it is not writable by this process; run as root or pass a delegated parent"
            }
            _ => "the kernel refused the write",
        };
        let wanted: Vec<String> = all.iter().map(|c| format!("+{c}")).collect();
        CgroupError::io(
            format!(
                "cannot enable '{}' in {}: {why}",
                wanted.join(" "),
                control.display()
            ),
            e,
        )
    })
}

/// Creates `<prefix><pid>-<n>` (`agentrl-<pid>-<n>`, see [`Mode`]) under every parent (same
/// name in each), picking a fresh `n` when the name is taken.
fn make_base(
    parents: &[PathBuf],
    fake: bool,
    version: Version,
    prefix: &str,
) -> Result<BaseDirs, CgroupError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}{}-{n}", std::process::id());
        let mut guard = DirGuard {
            dirs: Vec::new(),
            fake,
        };
        let mut taken = false;
        let mut locks = Vec::new();
        for p in parents {
            let d = p.join(&name);
            match fs::create_dir(&d) {
                Ok(()) => guard.dirs.push(d.clone()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    taken = true;
                    break;
                }
                Err(e) => {
                    return Err(CgroupError::io(
                        format!("cannot create cgroup directory {}", d.display()),
                        e,
                    ))
                }
            }
            // Ours from here on: a manager reaping stale bases leaves a locked one alone.
            // (A file system without flock leaves it unlocked, and a reaper unable to lock
            // it leaves it alone as well.)
            match try_lock_dir(&d) {
                Ok(Some(fd)) => locks.push(fd),
                Ok(None) => {
                    return Err(CgroupError::msg(format!(
                        "the new cgroup {} is locked by another process",
                        d.display()
                    )))
                }
                Err(_) => {}
            }
            if fake {
                fake_populate(&d, version).map_err(|e| {
                    CgroupError::io(format!("cannot populate fake cgroup {}", d.display()), e)
                })?;
            }
        }
        if !taken {
            return Ok(BaseDirs {
                dirs: guard.disarm(),
                fake,
                _locks: locks,
            });
        }
    }
    Err(CgroupError::msg(format!(
        "cannot find a free base cgroup name under {}",
        parents[0].display()
    )))
}

/// Owns the private base cgroup and creates [`Slot`]s below it.
///
/// The base directories are removed when the manager *and* all slots it created have been
/// dropped (slots keep the base alive), so drop order does not matter; removal never panics.
#[derive(Debug)]
pub struct Manager {
    version: Version,
    pub(super) fake: bool,
    /// Parent directory of the base, one per hierarchy (v2: one).
    pub(super) parents: Vec<PathBuf>,
    base: Arc<BaseDirs>,
    /// Hierarchy index (into `parents` / `base.dirs`) per controller `[memory, pids, cpuacct]`.
    pub(super) ctl: [usize; 3],
    /// Where each hierarchy is mounted (v2: the root), indexed like `parents`.
    pub(super) mounts: Vec<PathBuf>,
}

impl Manager {
    /// Detects v2 (pure unified at `/sys/fs/cgroup`) or v1 (`memory`, `pids` and `cpuacct`
    /// mounted), and creates the private base cgroup `agentrl-<pid>-<n>` as described in
    /// `docs/design/cgroups.md`. `parent` overrides where the base goes: on v2 a cgroup
    /// directory (absolute, or relative to the root); on v1 a path relative to each
    /// controller's mount, or an absolute path inside one of them (its relative part is used
    /// for all).
    pub fn new(parent: Option<&Path>) -> Result<Manager, CgroupError> {
        Self::with_root(Path::new(DEFAULT_ROOT), parent)
    }

    /// [`Manager::new`] with another cgroup root, e.g. a fake tree for tests (see
    /// `docs/design/cgroups.md` on fake mode).
    pub fn with_root(root: &Path, parent: Option<&Path>) -> Result<Manager, CgroupError> {
        let m = Self::build(root, parent, &read_self_cgroup()?, &read_mountinfo)?;
        m.remove_stale();
        Ok(m)
    }

    pub(super) fn build(
        root: &Path,
        parent: Option<&Path>,
        self_cgroup: &str,
        mountinfo: &dyn Fn() -> String,
    ) -> Result<Manager, CgroupError> {
        Self::build_for(Mode::Native, root, parent, self_cgroup, mountinfo)
    }

    pub(super) fn build_for(
        mode: Mode,
        root: &Path,
        parent: Option<&Path>,
        self_cgroup: &str,
        mountinfo: &dyn Fn() -> String,
    ) -> Result<Manager, CgroupError> {
        if root.join("cgroup.controllers").is_file() {
            Self::build_v2(mode, root, parent, self_cgroup, mountinfo)
        } else {
            Self::build_v1(mode, root, parent, self_cgroup, mountinfo)
        }
    }

    fn build_v2(
        mode: Mode,
        root: &Path,
        parent: Option<&Path>,
        self_cgroup: &str,
        mountinfo: &dyn Fn() -> String,
    ) -> Result<Manager, CgroupError> {
        let fake = !is_cgroupfs(root);
        let mut fallback_from = None;
        let parent_dir = match parent {
            Some(p) => {
                let p = if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    root.join(p)
                };
                if !p.join("cgroup.procs").is_file() {
                    return Err(CgroupError::msg(format!(
                        "cgroup parent {} is not a cgroup v2 directory (no cgroup.procs)",
                        p.display()
                    )));
                }
                p
            }
            None => match own_v2_placement(root, self_cgroup, mountinfo, fake)? {
                Placement::Here(dir) => dir,
                Placement::Ancestor { own, dir } => {
                    fallback_from = Some(own);
                    dir
                }
            },
        };
        Self::setup_v2(mode, root, parent_dir.clone(), fake).map_err(|mut e| {
            if let Some(own) = fallback_from {
                e.what = format!(
                    "this process's cgroup {} also holds other processes and is not delegated, \
                     so the sandbox goes in its nearest ancestor without processes, {}; that \
                     failed: {} (pass cgroup_parent; see docs/deployment.md)",
                    own.display(),
                    parent_dir.display(),
                    e.what
                );
            }
            e
        })
    }

    fn setup_v2(
        mode: Mode,
        root: &Path,
        parent_dir: PathBuf,
        fake: bool,
    ) -> Result<Manager, CgroupError> {
        // Enable controllers along the path root ..= parent_dir.
        let canon = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let (croot, cparent) = (canon(root), canon(&parent_dir));
        let rest = cparent.strip_prefix(&croot).map_err(|_| {
            CgroupError::msg(format!(
                "cgroup parent {} is not inside the cgroup v2 hierarchy at {}",
                parent_dir.display(),
                root.display()
            ))
        })?;
        let mut dir = croot.clone();
        ensure_controllers(&dir, fake, mode.optional())?;
        for c in rest.components() {
            dir.push(c);
            ensure_controllers(&dir, fake, mode.optional())?;
        }
        let base = Arc::new(make_base(
            std::slice::from_ref(&parent_dir),
            fake,
            Version::V2,
            mode.base_prefix(),
        )?);
        ensure_controllers(&base.dirs[0], fake, mode.optional())?;
        Ok(Manager {
            version: Version::V2,
            fake,
            parents: vec![parent_dir],
            base,
            ctl: [0; 3],
            mounts: vec![root.to_path_buf()],
        })
    }

    fn build_v1(
        mode: Mode,
        root: &Path,
        parent: Option<&Path>,
        self_cgroup: &str,
        mountinfo: &dyn Fn() -> String,
    ) -> Result<Manager, CgroupError> {
        // Unique hierarchies (mount dir, first controller found in it) and controller mapping.
        let mut mounts: Vec<(PathBuf, PathBuf, &str)> = Vec::new(); // (mount, canonical, ctrl)
        let mut ctl = [0usize; 3];
        for (i, c) in V1_CONTROLLERS.into_iter().enumerate() {
            let m = find_v1_mount(root, c).ok_or_else(|| {
                CgroupError::msg(format!(
                    "cgroup v1 controller '{c}' is not mounted (looked for {} or a co-mounted \
                     directory such as 'cpu,cpuacct'), and {} is not a cgroup v2 hierarchy (no \
                     cgroup.controllers)",
                    root.join(c).display(),
                    root.display()
                ))
            })?;
            let cm = fs::canonicalize(&m).unwrap_or_else(|_| m.clone());
            ctl[i] = match mounts.iter().position(|(_, k, _)| *k == cm) {
                Some(j) => j,
                None => {
                    mounts.push((m, cm, c));
                    mounts.len() - 1
                }
            };
        }
        let fake = !is_cgroupfs(&mounts[0].0);
        let mut parents = Vec::new();
        for (mount, _, ctrl) in &mounts {
            let p = match parent {
                Some(p) if p.is_relative() => mount.join(p),
                Some(p) => {
                    let rel = mounts
                        .iter()
                        .find_map(|(m, _, _)| p.strip_prefix(m).ok())
                        .ok_or_else(|| {
                            CgroupError::msg(format!(
                                "cgroup parent {} is not inside any of the v1 hierarchies {:?}",
                                p.display(),
                                mounts.iter().map(|m| &m.0).collect::<Vec<_>>()
                            ))
                        })?;
                    mount.join(rel)
                }
                None => {
                    let rel = own_cgroup(self_cgroup, Some(ctrl)).unwrap_or("/");
                    resolve_own(mount, rel, mountinfo)
                }
            };
            if !p.join("cgroup.procs").is_file() {
                return Err(CgroupError::msg(format!(
                    "cgroup parent {} is not a cgroup v1 directory (no cgroup.procs)",
                    p.display()
                )));
            }
            parents.push(p);
        }
        let base = make_base(&parents, fake, Version::V1, mode.base_prefix())?;
        Ok(Manager {
            version: Version::V1,
            fake,
            parents,
            base: Arc::new(base),
            ctl,
            mounts: mounts.into_iter().map(|(m, _, _)| m).collect(),
        })
    }

    /// The cgroup version in use.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The private base cgroup directories (v2: one; v1: one per distinct hierarchy).
    pub fn base_dirs(&self) -> &[PathBuf] {
        &self.base.dirs
    }
    /// Creates the cgroup(s) of slot `index` (`slot-<index>` under the base). Fails if that
    /// slot already exists. The new slot has no limits and a fresh per-run baseline.
    pub fn create_slot(&self, index: usize) -> Result<Slot, CgroupError> {
        self.create(format!("slot-{index}"), index)
    }

    /// Creates a fresh cgroup for one run of slot `index` (`slot-<index>-run` beside the
    /// slot's own), removed when the returned [`Slot`] is dropped. For cgroup v2 kernels whose
    /// `memory.peak` cannot be reset ([`PeakMemory::LifetimeOnly`], Linux 5.19–6.11): the
    /// lifetime peak of a cgroup made for the run is the run's exact peak. A run of a slot
    /// that is not in the slot's own cgroup is not charged the slot's warm interpreter, so
    /// its limits need no baseline. One that an earlier run left (its removal timed out) is
    /// killed and removed first.
    pub fn create_run_cgroup(&self, index: usize) -> Result<Slot, CgroupError> {
        let name = format!("slot-{index}-run");
        for base in &self.base.dirs {
            let d = base.join(&name);
            if d.exists() {
                remove_tree(&d, self.fake, true);
            }
        }
        self.create(name, index)
    }

    pub(super) fn create(&self, name: String, index: usize) -> Result<Slot, CgroupError> {
        let fake = self.fake;
        let mut guard = DirGuard {
            dirs: Vec::new(),
            fake,
        };
        let mut fds = Vec::new();
        for base in &self.base.dirs {
            let d = base.join(&name);
            fs::create_dir(&d).map_err(|e| {
                let what = if e.kind() == ErrorKind::AlreadyExists {
                    format!("cgroup {name} already exists ({})", d.display())
                } else {
                    format!("cannot create cgroup directory {}", d.display())
                };
                CgroupError::io(what, e)
            })?;
            guard.dirs.push(d.clone());
            if fake {
                fake_populate(&d, self.version).map_err(|e| {
                    CgroupError::io(format!("cannot populate fake cgroup {}", d.display()), e)
                })?;
            }
            fds.push(
                open_dir(&d)
                    .map_err(|e| CgroupError::io(format!("cannot open {}", d.display()), e))?,
            );
        }
        let dirs = &guard.dirs;
        let fd = |c: usize| fds[self.ctl[c]].as_fd();
        let path = |c: usize, f: &str| dirs[self.ctl[c]].join(f);
        let exists = |c: usize, f: &str| path(c, f).exists();
        let open = |c: usize, f: &CStr, flags| {
            open_at(fd(c), f, flags).map_err(|e| {
                CgroupError::io(
                    format!("cannot open {}", path(c, &f.to_string_lossy()).display()),
                    e,
                )
            })
        };

        let peak_file;
        let peak_mode;
        let (cpu_file, has_memsw, oom_source) = match self.version {
            Version::V2 => {
                match open_at(fd(MEM), c"memory.swap.max", libc::O_WRONLY) {
                    Ok(f) => write_once(&f, b"0", fake).map_err(|e| {
                        CgroupError::io(
                            format!(
                                "cannot write '0' to {}",
                                path(MEM, "memory.swap.max").display()
                            ),
                            e,
                        )
                    })?,
                    Err(e) if e.kind() == ErrorKind::NotFound => {} // no swap accounting
                    Err(e) => {
                        return Err(CgroupError::io(
                            format!("cannot open {}", path(MEM, "memory.swap.max").display()),
                            e,
                        ))
                    }
                }
                (peak_file, peak_mode) = probe_v2_peak(fd(MEM), fake);
                (open(CPU, c"cpu.stat", libc::O_RDONLY)?, false, OOM_V2)
            }
            Version::V1 => {
                peak_file = Some(open(MEM, c"memory.max_usage_in_bytes", libc::O_RDWR)?);
                peak_mode = PeakMemory::PerRun;
                let oom = read_path(&path(MEM, "memory.oom_control"))?;
                (
                    open(CPU, c"cpuacct.usage", libc::O_RDONLY)?,
                    exists(MEM, "memory.memsw.limit_in_bytes"),
                    if keyed_u64(oom.as_bytes(), "oom_kill").is_some() {
                        OOM_V1
                    } else {
                        OOM_V1_FAILCNT
                    },
                )
            }
        };
        let oom_file = open(MEM, oom_source.0, libc::O_RDONLY)?;
        let pids_events_file = match open_at(fd(PIDS), c"pids.events", libc::O_RDONLY) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                return Err(CgroupError::io(
                    format!("cannot open {}", path(PIDS, "pids.events").display()),
                    e,
                ))
            }
        };
        let has_kill =
            self.version == Version::V2 && exists(MEM, "cgroup.kill") && !hidden("cgroup.kill");
        let mut slot = Slot {
            version: self.version,
            fake,
            index,
            dirs: guard.disarm(),
            fds,
            ctl: self.ctl,
            cpu_file,
            peak_file,
            peak_mode,
            has_memsw,
            oom_source,
            oom_file,
            pids_events_file,
            has_kill,
            mem_limit: Some(None),
            pids_limit: Some(None),
            baseline: Baseline::default(),
            sampled_peak: AtomicU64::new(0),
            _base: Arc::clone(&self.base),
        };
        slot.prepare_run()?;
        Ok(slot)
    }
}
