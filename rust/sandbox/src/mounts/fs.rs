//! File helpers at directory fds (`mkdirat`, `openat`, `symlinkat`, `fchownat`, `openat2`
//! beneath a directory) and box path helpers.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::sys::{c, cpath};

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

pub(super) fn symlinkat(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
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

pub(super) fn open_path(p: &Path) -> io::Result<OwnedFd> {
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

pub(super) fn rel(p: &Path) -> &[u8] {
    let b = p.as_os_str().as_bytes();
    let mut i = 0;
    while i < b.len() && b[i] == b'/' {
        i += 1;
    }
    &b[i..]
}

pub(super) fn rel_path(p: &Path) -> &Path {
    p.strip_prefix("/").unwrap_or(p)
}

/// The directories made under one directory fd, each asked of the kernel once.
///
/// A slot's root template copies ~1,000 files of the host's `/etc` under a handful of
/// directories (`etc/ssl/certs`, `etc/alternatives`, ...): making every parent of each with its
/// own `mkdirat` cost ~2,000 failing calls (`EEXIST`) and a few milliseconds of every slot's
/// set-up, and a first call sets up one slot per box it runs at once. A path is remembered
/// once its `mkdirat` succeeded or found an entry there, which is all a second call would
/// find (nothing is removed while a template is built), so the result is the same.
#[derive(Default)]
pub(crate) struct DirsMade(std::collections::HashSet<Vec<u8>>);

impl DirsMade {
    /// [`mkdirat`] (mode 0755), unless this path was made already.
    pub(crate) fn mkdir(&mut self, dir: BorrowedFd<'_>, path: &[u8]) -> io::Result<()> {
        if !self.0.contains(path) {
            mkdirat(dir, path, 0o755)?;
            self.0.insert(path.to_vec());
        }
        Ok(())
    }

    /// Creates every parent directory of `path` (relative to `dir`).
    pub(crate) fn parents(&mut self, dir: BorrowedFd<'_>, path: &[u8]) -> io::Result<()> {
        let mut i = 0;
        while let Some(j) = path[i..].iter().position(|&b| b == b'/') {
            let end = i + j;
            if end > 0 {
                self.mkdir(dir, &path[..end])?;
            }
            i = end + 1;
        }
        Ok(())
    }
}

pub(super) fn unsafe_zeroed_stat() -> libc::stat {
    // SAFETY: libc::stat is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

pub(super) fn chown_at(dir: BorrowedFd<'_>, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
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

pub(super) fn chmod_at(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
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
pub(super) fn openat2_beneath(dir: BorrowedFd<'_>, path: &[u8]) -> io::Result<OwnedFd> {
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
