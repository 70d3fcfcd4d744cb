//! Tests of the seccomp module: the compiled program's verdicts (run on a classic-BPF
//! interpreter), the listener's plumbing, and live filters installed in forked children.

use super::bpf::*;
use super::description::*;
use super::notify::*;
use super::policy::*;
use super::tables::nr;
use super::*;
use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use libc::{c_int, c_long, sock_filter};

use crate::sys;

mod listener;
mod live;
mod verdicts;

const NONE: [u64; 6] = [0; 6];
const DEFAULT: Policy = Policy {
    allow_network: false,
};
const NETWORK: Policy = Policy {
    allow_network: true,
};

fn socketpair() -> (OwnedFd, OwnedFd) {
    let mut sv = [0; 2];
    // SAFETY: `sv` has room for two fds.
    let ret = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    };
    assert_eq!(ret, 0, "{}", io::Error::last_os_error());
    // SAFETY: both fds were just created and are owned here.
    unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) }
}
