//! The per-run side: [`ChildPaths`] (the paths the child mounts at), [`RunFs`] (the per-run
//! tmpfs of `/work`, `/tmp` and `/dev/shm`) and [`collect_at`] (reading the files a run left).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::fs::{
    chmod_at, chown_at, mkdirat, open_dir_at, openat2_beneath, unsafe_zeroed_stat, write_file_at,
};
use super::sys::{cpath, new_tmpfs, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID};

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
