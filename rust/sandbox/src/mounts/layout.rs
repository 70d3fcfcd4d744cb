//! [`Layout`]: what the box's root is made of (binds of the host's system directories, the
//! interpreters' prefixes and the caller's binds, devices, the `/etc` copies), discovered once
//! per sandbox.

use std::path::{Path, PathBuf};

use super::etc::{collect_etc, EtcItem, ETC_ALLOW, ETC_ALLOW_NETWORK};
use crate::config::{Bind, SandboxConfig};
use crate::error::{Error, Result};

/// One entry of the root skeleton.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Entry {
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
    pub(super) entries: Vec<Entry>,
    /// The extension module's bytes, for the warm interpreter (read once per sandbox).
    pub(super) core_module: Option<std::sync::Arc<Vec<u8>>>,
    pub(super) etc_files: Vec<(PathBuf, EtcItem)>,
    pub(super) network: bool,
}

const SYSTEM_DIRS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

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
