//! The identity steps shared by pid 1, pid 2 and a warm interpreter: restoring the host's
//! dumpable flag after a uid change, and clearing every capability set.

use super::status::step;
use super::{ChildPlan, Step};
use crate::sys::{syscall3, syscall6};

/// See [`ChildPlan::host_dumpable`].
#[inline(always)]
pub(super) fn restore_dumpable(p: &ChildPlan<'_>) {
    if p.host_dumpable {
        // SAFETY: prctl with flags only.
        unsafe { syscall3(libc::SYS_prctl, libc::PR_SET_DUMPABLE as usize, 1, 0) };
    }
}

/// Clears every capability set (the bounding set is left to the caller).
///
/// # Safety
/// Raw system calls with valid stack buffers only.
pub(super) unsafe fn drop_capabilities(p: &ChildPlan<'_>) {
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [CapData::default(), CapData::default()];
    // SAFETY: capset with a valid header and two data entries (version 3).
    unsafe {
        step!(
            p,
            Step::Capset,
            syscall3(
                libc::SYS_capset,
                &header as *const CapHeader as usize,
                data.as_ptr() as usize,
                0
            )
        );
        step!(
            p,
            Step::Capset,
            syscall6(
                libc::SYS_prctl,
                libc::PR_CAP_AMBIENT as usize,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as usize,
                0,
                0,
                0,
                0
            )
        );
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
