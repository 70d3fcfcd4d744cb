//! The box's `/etc`: what of the host's is copied ([`ETC_ALLOW`], never a secret by name or
//! anything an unprivileged host user could not read) and the generated `/etc/hosts`.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub(super) enum EtcItem {
    Data(Vec<u8>),
    Symlink(PathBuf),
    /// An empty directory.
    Dir,
}

/// Without network, `/etc/hosts` is the host's lines for `localhost` and its kin (so
/// `localhost` resolves in the box exactly as on the host: to 127.0.0.1 only, or to ::1
/// too) and the box's own name; other lines name the host or addresses the box cannot
/// reach, and are left out.
pub(super) fn loopback_hosts(host: &str) -> String {
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

/// What of the host's `/etc` the box sees (copied into the template once per slot, so it
/// costs nothing per run): the non-secret configuration that runtimes read. An entry the host
/// lacks is skipped; a name ending in `*` matches every entry of `/etc` it prefixes.
/// Directories are copied whole (symlinks as symlinks), except what `etc_secret` refuses.
/// `passwd`, `group`, `hostname`, `hosts` (without network) and `mtab` are generated instead.
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
pub(super) const ETC_ALLOW_NETWORK: &[&str] = &["resolv.conf"];
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

/// Whether a path under `/etc` (relative) must never reach the box, by name (see
/// [`ETC_SECRET`]).
pub(super) fn etc_secret(rel: &Path) -> bool {
    let s = rel.to_string_lossy().to_ascii_lowercase();
    ETC_SECRET.iter().any(|f| s.contains(f))
}

/// Copies `host` (a file, a symlink or a directory, recursively) into `out` as `rel`, except
/// a secret by name ([`etc_secret`]), anything an unprivileged host user could not read
/// (a file without `o+r`, a directory without `o+rx`) and files over 4 MiB.
pub(super) fn collect_etc(
    host: PathBuf,
    rel: PathBuf,
    depth: u32,
    out: &mut Vec<(PathBuf, EtcItem)>,
) {
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
