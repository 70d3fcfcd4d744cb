//! [`Template`]: the slot's read-only root skeleton, built once per slot on the slot's own
//! thread (bind sources cloned before it is attached, then moved into it).

use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::cgroup_view::CgroupView;
use super::etc::{loopback_hosts, EtcItem};
use super::fs::{open_dir_at, open_path, rel, rel_path, symlinkat, write_file_at, DirsMade};
use super::layout::{Entry, Layout};
use super::sys::{
    attach, clone_tree, new_tmpfs, set_attrs, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC,
    MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};
use super::BOX_ID;
use crate::error::{Error, Result};

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
        let mut dirs = DirsMade::default();
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
            dirs.mkdir(d, name.as_bytes())
                .map_err(err(format!("mkdir /{name}")))?;
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
            dirs.parents(d, r).map_err(err(format!(
                "creating the mount point {}",
                target.display()
            )))?;
            if *is_dir {
                dirs.mkdir(d, r)
                    .map_err(err(format!("mkdir {}", target.display())))?;
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
            dirs.parents(d, pb)
                .map_err(err(format!("mkdir for /{}", p.display())))?;
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
                    dirs.mkdir(d, pb)
                        .map_err(err(format!("mkdir /{}", p.display())))?;
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
        dirs.parents(d, init_rel)
            .map_err(err("creating /.agentrl".into()))?;
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
            let rel_path = rel(Path::new(crate::warm::CORE_MODULE_IN_BOX));
            dirs.parents(d, rel_path)
                .map_err(err("creating /.agentrl".into()))?;
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
