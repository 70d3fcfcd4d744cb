//! The mount API system calls (`fsopen`/`fsmount`, `open_tree`, `mount_setattr`,
//! `move_mount`) and the private mount namespace of a slot or session thread.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::Error;

const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;
pub(super) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(super) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(super) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(super) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const OPEN_TREE_CLONE: u32 = 1;
const OPEN_TREE_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const AT_RECURSIVE: u32 = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub(super) fn c(p: &[u8]) -> CString {
    CString::new(p).expect("paths are checked for NUL before they reach here")
}

pub(super) fn cpath(p: &Path) -> CString {
    c(p.as_os_str().as_bytes())
}

/// Gives the calling thread a mount namespace of its own whose mounts are all private
/// (`CLONE_FS` too: a thread that shares its fs_struct may not change mount namespace).
/// `whose` names the thread in errors.
pub(crate) fn private_mount_namespace(whose: &str) -> crate::error::Result<()> {
    // SAFETY: unshare affects only this thread's fs and mount namespace.
    if unsafe { libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS) } < 0 {
        return Err(Error::setup_io(
            format!("unsharing the {whose} mount namespace"),
            io::Error::last_os_error(),
        ));
    }
    let root = c"/";
    // SAFETY: mount with NULL source/type/data and a valid path.
    if unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    } < 0
    {
        return Err(Error::setup_io(
            format!("making the {whose} mounts private"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Creates a detached tmpfs mount with the given options and mount attributes.
pub(crate) fn new_tmpfs(options: &[(&str, String)], attrs: u64) -> io::Result<OwnedFd> {
    let name = c(b"tmpfs");
    // SAFETY: fsopen takes a NUL-terminated name and flags; it returns a new fd we own.
    let fs = unsafe {
        cvt(libc::syscall(
            libc::SYS_fsopen,
            name.as_ptr(),
            libc::FSOPEN_CLOEXEC,
        ))?
    };
    // SAFETY: fs is a valid fd just returned by fsopen and owned by nobody else.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    for (k, v) in options {
        let (k, v) = (c(k.as_bytes()), c(v.as_bytes()));
        // SAFETY: fs is a valid fs-context fd; key and value are NUL-terminated strings.
        unsafe {
            cvt(libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            ))?;
        }
    }
    // SAFETY: as above, with no key or value.
    unsafe {
        cvt(libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
        ))?
    };
    // SAFETY: fsmount on a created fs context; returns a new mount fd we own.
    let m = unsafe {
        cvt(libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attrs,
        ))?
    };
    // SAFETY: m is a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(m as RawFd) })
}

/// Clones the mount tree at `path` into a detached mount (`open_tree(OPEN_TREE_CLONE)`) and
/// sets `attrs` on it (recursively when `recursive`).
pub(super) fn clone_tree(path: &Path, recursive: bool, attrs: u64) -> io::Result<OwnedFd> {
    let p = cpath(path);
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: p is NUL-terminated; the returned fd is new and ours.
    let fd = unsafe {
        cvt(libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            p.as_ptr(),
            flags,
        ))?
    };
    // SAFETY: fd is a fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    set_attrs(fd.as_fd(), recursive, attrs)?;
    Ok(fd)
}

/// `mount_setattr` on the mount an fd refers to.
pub(super) fn set_attrs(fd: BorrowedFd<'_>, recursive: bool, attrs: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = c(b"");
    let flags = libc::AT_EMPTY_PATH as u32 | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: fd is valid; attr is a properly laid out mount_attr and its size is passed.
    unsafe {
        cvt(libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ))?;
    }
    Ok(())
}

/// Attaches a detached mount at `target` (`move_mount`).
pub(super) fn attach(fd: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let empty = c(b"");
    let t = cpath(target);
    // SAFETY: both strings are NUL-terminated; fd is a valid mount fd.
    unsafe {
        cvt(libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ))?;
    }
    Ok(())
}
