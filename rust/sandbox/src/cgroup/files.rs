//! Low-level file helpers: `openat`, whole-file reads and single writes, parsers of cgroup
//! files, and the few system calls (`flock`, `statfs`, `kill`) the cgroup code makes.

use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{CgroupError, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};

pub(super) fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

/// Opens directory `path` and takes an exclusive `flock` on it without waiting: `Ok(None)`
/// when another open file holds it. The lock lasts as long as the returned fd (and dies with
/// the process).
pub(super) fn try_lock_dir(path: &Path) -> io::Result<Option<OwnedFd>> {
    let fd = open_dir(path)?;
    loop {
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(fd));
        }
        let e = io::Error::last_os_error();
        match errno(&e) {
            libc::EINTR => continue,
            libc::EWOULDBLOCK => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// `openat(dir, name, flags | O_CLOEXEC)`, retried on `EINTR`.
pub(super) fn open_at(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<File> {
    loop {
        // SAFETY: `name` is a NUL-terminated string that outlives the call and `dir` is an open
        // descriptor borrowed for the duration of the call.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOCTTY,
            )
        };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by `openat`, is valid and owned by nobody else.
            return Ok(unsafe { File::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reads a whole small file from offset 0 into `buf` (cgroup files regenerate on a read at 0).
pub(super) fn read_into<'a>(file: &File, buf: &'a mut [u8]) -> io::Result<&'a [u8]> {
    let mut n = 0;
    loop {
        if n == buf.len() {
            return Err(io::Error::new(
                ErrorKind::InvalidData,
                "file is larger than expected",
            ));
        }
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => return Ok(&buf[..n]),
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads a whole file of any size from offset 0.
pub(super) fn read_vec(file: &File) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == out.len() {
            out.resize(n * 2, 0);
        }
        match file.read_at(&mut out[n..], n as u64) {
            Ok(0) => {
                out.truncate(n);
                return Ok(out);
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes `data` with one `pwrite` at offset 0 (cgroup files must get a value in one write).
/// In fake mode the file is then truncated to the written length.
pub(super) fn write_once(file: &File, data: &[u8], fake: bool) -> io::Result<()> {
    loop {
        match file.write_at(data, 0) {
            Ok(n) if n == data.len() => break,
            Ok(n) => {
                return Err(io::Error::new(
                    ErrorKind::WriteZero,
                    format!("short write ({n} of {} bytes)", data.len()),
                ))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if fake {
        file.set_len(data.len() as u64)?;
    }
    Ok(())
}

pub(super) fn write_path(path: &Path, data: &str, fake: bool) -> io::Result<()> {
    let f = OpenOptions::new().write(true).truncate(fake).open(path)?;
    write_once(&f, data.as_bytes(), fake)
}

pub(super) fn read_path(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path)
        .map_err(|e| CgroupError::io(format!("cannot read {}", path.display()), e))
}

pub(super) fn parse_u64(data: &[u8]) -> Option<u64> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

/// Value of the `key value` line named `key` in a flat-keyed cgroup file.
pub(super) fn keyed_u64(data: &[u8], key: &str) -> Option<u64> {
    std::str::from_utf8(data).ok()?.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        if it.next()? == key {
            it.next()?.parse().ok()
        } else {
            None
        }
    })
}

pub(super) fn parse_pids(data: &[u8]) -> Vec<libc::pid_t> {
    std::str::from_utf8(data)
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Formats `v` in decimal into `buf` without allocating.
pub(super) fn fmt_u64(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

pub(super) fn limit_string(limit: Option<u64>, unlimited: &str) -> String {
    limit.map_or_else(|| unlimited.to_string(), |v| v.to_string())
}

pub(super) fn is_cgroupfs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable memory large enough for
    // a `struct statfs`.
    let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return false;
    }
    // SAFETY: `statfs` returned 0, so it filled in `st`.
    let st = unsafe { st.assume_init() };
    let t = st.f_type as u64;
    t == CGROUP_SUPER_MAGIC || t == CGROUP2_SUPER_MAGIC
}

pub(super) fn sigkill(pid: libc::pid_t) {
    if pid <= 0 || pid as u32 == std::process::id() {
        return;
    }
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

pub(super) fn pid_alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence; no memory is involved.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
