//! Tests of the pure parts of the box's file system: the cgroup view, `/etc/hosts`,
//! mountinfo escapes and what of `/etc` is copied.

use std::path::{Path, PathBuf};

use super::cgroup_view::{unescape_mountinfo, CgroupView};
use super::etc::{collect_etc, etc_secret, loopback_hosts};

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
