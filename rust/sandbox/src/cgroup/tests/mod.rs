//! Tests of the cgroup code: pure helpers, fake trees (v2 and v1) and, as root, the real
//! cgroup file system. The helpers below build the fake trees.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

mod fake_v1;
mod fake_v2;
mod nsjail;
mod pure;
mod real;

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "agentrl-cgroup-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn put(path: &Path, content: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn get(path: &Path) -> String {
    fs::read_to_string(path).unwrap()
}

/// A fake v2 cgroup directory (as the kernel would show it) at `dir`.
fn fake_v2_dir(dir: &Path, controllers: &str, subtree: &str, procs: &str) {
    put(&dir.join("cgroup.controllers"), controllers);
    put(&dir.join("cgroup.subtree_control"), subtree);
    put(&dir.join("cgroup.procs"), procs);
}

const ALL: &str = "cpuset cpu io memory hugetlb pids rdma misc\n";
/// Above the largest possible pid_max (2^22), so never a real process.
const FAKE_PID: libc::pid_t = 2_147_483_632;
const NO_MI: &dyn Fn() -> String = &String::new;

fn fake_v2_root() -> TempDir {
    let t = TempDir::new();
    fake_v2_dir(&t.0, ALL, "", "2147483632\n");
    t
}
