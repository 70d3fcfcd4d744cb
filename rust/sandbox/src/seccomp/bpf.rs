//! Compiling the policy to a classic-BPF program ([`Filter`]) and installing it.

use std::mem::offset_of;

use libc::{c_long, sock_filter};

use super::policy::{
    Policy, ALLOWED_PERSONAS, ALLOW_ARCH, ALLOW_COMMON, CLONE_NAMESPACE_FLAGS, DENY_ARCH,
    DENY_COMMON, ERRNO_PLAIN, LOCAL_DOMAINS, LOCAL_NETLINK_PROTOCOLS, NETWORK_DOMAINS,
    PLAIN_NETLINK_PROTOCOLS, REFUSED_IOCTLS,
};
#[cfg(target_arch = "aarch64")]
use super::tables::nr;
use crate::sys;

/// A compiled seccomp-bpf program.
#[derive(Debug, Clone)]
pub struct Filter {
    program: Vec<sock_filter>,
}

// ---------------------------------------------------------------------------------------------
// Classic BPF encoding
// ---------------------------------------------------------------------------------------------

/// `BPF_LD | BPF_W | BPF_ABS`: load the 32-bit word at offset `k` of `seccomp_data`.
pub(super) const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// `BPF_JMP | BPF_JA`: jump forward `k` instructions.
pub(super) const JMP_JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
pub(super) const JMP_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JGE | BPF_K` (unsigned).
pub(super) const JMP_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JSET | BPF_K`.
pub(super) const JMP_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
/// `BPF_RET | BPF_K`.
pub(super) const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Longest program the kernel accepts (`BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

/// `AUDIT_ARCH_X86_64`: `EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`.
#[cfg(target_arch = "x86_64")]
pub const AUDIT_ARCH_NATIVE: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `AUDIT_ARCH_AARCH64`: `EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`.
#[cfg(target_arch = "aarch64")]
pub const AUDIT_ARCH_NATIVE: u32 = 183 | 0x8000_0000 | 0x4000_0000;

/// `__X32_SYSCALL_BIT`.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

pub(super) const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
pub(super) const RET_NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;
pub(super) const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
pub(super) const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

pub(super) const OFF_NR: u32 = offset_of!(libc::seccomp_data, nr) as u32;
pub(super) const OFF_ARCH: u32 = offset_of!(libc::seccomp_data, arch) as u32;

/// Offset of the low 32 bits of argument `i` in `seccomp_data`.
pub(super) const fn arg_low(i: usize) -> u32 {
    let base = offset_of!(libc::seccomp_data, args) + 8 * i;
    if cfg!(target_endian = "big") {
        (base + 4) as u32
    } else {
        base as u32
    }
}

pub(super) fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// What the program does for a range of system-call numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leaf {
    /// Return this action.
    Ret(u32),
    /// `clone`: notify if arg0 has namespace flags, else allow.
    Clone,
    /// `socket`/`socketpair`: allow the policy's domains in arg0, else notify.
    Socket,
    /// `ioctl`: notify for `TIOCSTI`/`TIOCLINUX` in arg1, else allow.
    Ioctl,
    /// `personality`: allow a query in arg0, else notify.
    Personality,
    /// `setrlimit`: a change of a [`PINNED_RLIMIT`] in arg0 succeeds without effect, else
    /// allow.
    Setrlimit,
    /// `prlimit64`: a change (arg2 not NULL) of a [`PINNED_RLIMIT`] in arg1 succeeds without
    /// effect when it reads nothing back (arg3 NULL, as glibc's `setrlimit`), else fails with
    /// `EPERM`; everything else (reads, other resources) is allowed.
    Prlimit,
}

/// The resource limit a program may not change: `RLIMIT_CORE`. The box runs with a limit of
/// exactly 1 byte, the one value that stops a piped `core_pattern` (the host's core handler,
/// started as host root); at 0 the kernel would start the handler again. A program that
/// lowers it (`ulimit -c 0`, as test runners do to keep cores away) is told it succeeded: a
/// 1-byte limit writes no core file either, so what it asked for holds.
#[allow(clippy::unnecessary_cast)] // c_uint on glibc, c_int elsewhere
pub const PINNED_RLIMIT: u32 = libc::RLIMIT_CORE as u32;

/// `setrlimit` (the `libc` crate lacks it on aarch64).
#[cfg(target_arch = "x86_64")]
pub(super) const SYS_SETRLIMIT: c_long = libc::SYS_setrlimit;
#[cfg(target_arch = "aarch64")]
pub(super) const SYS_SETRLIMIT: c_long = nr::SYS_setrlimit;

/// `RET_ERRNO` with errno 0: the call returns 0 without running.
pub(super) const RET_SUCCEED: u32 = libc::SECCOMP_RET_ERRNO;

/// [`Leaf::Prlimit`]'s code.
fn prlimit_check() -> Vec<sock_filter> {
    let high = |i: usize| {
        if cfg!(target_endian = "big") {
            arg_low(i) - 4
        } else {
            arg_low(i) + 4
        }
    };
    vec![
        /* 0 */ stmt(LD_W_ABS, arg_low(1)),
        /* 1 */ jump(JMP_JEQ_K, PINNED_RLIMIT, 1, 0),
        /* 2 */ stmt(RET_K, RET_ALLOW),
        /* 3 */ stmt(LD_W_ABS, arg_low(2)),
        /* 4 */ jump(JMP_JEQ_K, 0, 0, 3), // new limit set: to 8
        /* 5 */ stmt(LD_W_ABS, high(2)),
        /* 6 */ jump(JMP_JEQ_K, 0, 0, 1), // new limit set: to 8
        /* 7 */ stmt(RET_K, RET_ALLOW), // a read
        /* 8 */ stmt(LD_W_ABS, arg_low(3)),
        /* 9 */ jump(JMP_JEQ_K, 0, 0, 3), // old limit wanted: to 13
        /* 10 */ stmt(LD_W_ABS, high(3)),
        /* 11 */ jump(JMP_JEQ_K, 0, 0, 1), // old limit wanted: to 13
        /* 12 */ stmt(RET_K, RET_SUCCEED),
        /* 13 */ stmt(RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ]
}

/// `[LD arg; JEQ v0; ...; JEQ vn; RET on_miss; RET on_match]`.
fn match_arg(arg: usize, values: &[u32], on_match: u32, on_miss: u32) -> Vec<sock_filter> {
    let m = values.len();
    let mut code = Vec::with_capacity(m + 3);
    code.push(stmt(LD_W_ABS, arg_low(arg)));
    for (j, &v) in values.iter().enumerate() {
        // From the JEQ at index 1 + j, `RET on_match` (index m + 2) is m - j instructions on.
        let jt = u8::try_from(m - j).expect("short value list");
        code.push(jump(JMP_JEQ_K, v, jt, 0));
    }
    code.push(stmt(RET_K, on_miss));
    code.push(stmt(RET_K, on_match));
    code
}

/// `socket`/`socketpair` without [`Policy::allow_network`]: allow the `domains` in arg0, and
/// `AF_NETLINK` with one of the `protocols` in arg2; fail `AF_NETLINK` with one of the `plain`
/// protocols with `EPROTONOSUPPORT`, unreported; notify for everything else.
///
/// `[LD arg0; JEQ d0; ...; JEQ dn; JEQ AF_NETLINK; LD arg2; JEQ p0; ...; JEQ pm; JEQ q0; ...;
/// JEQ qk; RET notify; RET allow; RET errno]`.
fn socket_check(domains: &[u32], protocols: &[u32], plain: &[u32]) -> Vec<sock_filter> {
    let (m, p, q) = (domains.len(), protocols.len(), plain.len());
    let notify = m + p + q + 3; // index of `RET notify`
    let (allow, errno) = (notify + 1, notify + 2);
    let target = |from: usize, to: usize| u8::try_from(to - from - 1).expect("short value list");
    let mut code = Vec::with_capacity(errno + 1);
    code.push(stmt(LD_W_ABS, arg_low(0)));
    for &d in domains {
        let here = code.len();
        code.push(jump(JMP_JEQ_K, d, target(here, allow), 0));
    }
    let here = code.len();
    // Not AF_NETLINK: skip the protocol checks to `RET notify`.
    code.push(jump(
        JMP_JEQ_K,
        libc::AF_NETLINK as u32,
        0,
        target(here, notify),
    ));
    code.push(stmt(LD_W_ABS, arg_low(2)));
    for &proto in protocols {
        let here = code.len();
        code.push(jump(JMP_JEQ_K, proto, target(here, allow), 0));
    }
    for &proto in plain {
        let here = code.len();
        code.push(jump(JMP_JEQ_K, proto, target(here, errno), 0));
    }
    debug_assert_eq!(code.len(), notify);
    code.push(stmt(RET_K, RET_NOTIFY));
    code.push(stmt(RET_K, RET_ALLOW));
    code.push(stmt(
        RET_K,
        libc::SECCOMP_RET_ERRNO | libc::EPROTONOSUPPORT as u32,
    ));
    code
}

fn leaf_code(leaf: Leaf, policy: &Policy) -> Vec<sock_filter> {
    match leaf {
        Leaf::Ret(action) => vec![stmt(RET_K, action)],
        Leaf::Clone => vec![
            stmt(LD_W_ABS, arg_low(0)),
            jump(JMP_JSET_K, CLONE_NAMESPACE_FLAGS, 0, 1),
            stmt(RET_K, RET_NOTIFY),
            stmt(RET_K, RET_ALLOW),
        ],
        Leaf::Socket if policy.allow_network => {
            match_arg(0, NETWORK_DOMAINS, RET_ALLOW, RET_NOTIFY)
        }
        Leaf::Socket => socket_check(
            LOCAL_DOMAINS,
            LOCAL_NETLINK_PROTOCOLS,
            PLAIN_NETLINK_PROTOCOLS,
        ),
        Leaf::Ioctl => match_arg(1, REFUSED_IOCTLS, RET_NOTIFY, RET_ALLOW),
        Leaf::Personality => match_arg(0, ALLOWED_PERSONAS, RET_ALLOW, RET_NOTIFY),
        Leaf::Setrlimit => match_arg(0, &[PINNED_RLIMIT], RET_SUCCEED, RET_ALLOW),
        Leaf::Prlimit => prlimit_check(),
    }
}

/// Binary search over `ranges` (`(first number, leaf)`, ascending, the first starting at 0; each
/// range runs up to the next one's start, the last one to `u32::MAX`). The accumulator holds the
/// system-call number on entry. All jumps are forward; a branch too long for the 8-bit `jt`
/// goes through a `JA`.
pub(super) fn search_tree(ranges: &[(u32, Leaf)], policy: &Policy) -> Vec<sock_filter> {
    if ranges.len() == 1 {
        return leaf_code(ranges[0].1, policy);
    }
    let mid = ranges.len() / 2;
    let left = search_tree(&ranges[..mid], policy);
    let right = search_tree(&ranges[mid..], policy);
    let pivot = ranges[mid].0;
    let mut code = Vec::with_capacity(left.len() + right.len() + 2);
    match u8::try_from(left.len()) {
        // nr >= pivot: skip the left subtree; else fall into it.
        Ok(skip) => code.push(jump(JMP_JGE_K, pivot, skip, 0)),
        Err(_) => {
            code.push(jump(JMP_JGE_K, pivot, 0, 1));
            code.push(stmt(JMP_JA, left.len() as u32));
        }
    }
    code.extend(left);
    code.extend(right);
    code
}

/// Per-number rules of the policy, sorted by number.
pub(super) fn rules() -> Vec<(u32, Leaf)> {
    let mut rules: Vec<(u32, Leaf)> = Vec::with_capacity(512);
    let mut add = |nrs: &[c_long], leaf: Leaf| {
        rules.extend(nrs.iter().map(|&nr| (nr as u32, leaf)));
    };
    add(ALLOW_COMMON, Leaf::Ret(RET_ALLOW));
    add(ALLOW_ARCH, Leaf::Ret(RET_ALLOW));
    add(DENY_COMMON, Leaf::Ret(RET_NOTIFY));
    add(DENY_ARCH, Leaf::Ret(RET_NOTIFY));
    add(&[libc::SYS_clone3], Leaf::Ret(RET_ENOSYS));
    for &(nr, errno) in ERRNO_PLAIN {
        add(&[nr], Leaf::Ret(libc::SECCOMP_RET_ERRNO | errno as u32));
    }
    add(&[libc::SYS_clone], Leaf::Clone);
    add(&[libc::SYS_socket, libc::SYS_socketpair], Leaf::Socket);
    add(&[libc::SYS_ioctl], Leaf::Ioctl);
    add(&[libc::SYS_personality], Leaf::Personality);
    add(&[SYS_SETRLIMIT], Leaf::Setrlimit);
    add(&[libc::SYS_prlimit64], Leaf::Prlimit);
    rules.sort_unstable_by_key(|&(nr, _)| nr);
    debug_assert!(
        rules.windows(2).all(|w| w[0].0 != w[1].0),
        "a system call is listed twice"
    );
    rules
}

/// Collapses per-number rules into ranges covering all of `0..=u32::MAX`; unlisted numbers
/// notify (answered `ENOSYS`).
pub(super) fn ranges(rules: &[(u32, Leaf)]) -> Vec<(u32, Leaf)> {
    fn push(out: &mut Vec<(u32, Leaf)>, start: u32, leaf: Leaf) {
        if out.last().map(|&(_, l)| l) != Some(leaf) {
            out.push((start, leaf));
        }
    }
    let mut out = Vec::new();
    let mut next = 0u32;
    for &(nr, leaf) in rules {
        if nr > next {
            push(&mut out, next, Leaf::Ret(RET_NOTIFY));
        }
        push(&mut out, nr, leaf);
        next = nr + 1;
    }
    push(&mut out, next, Leaf::Ret(RET_NOTIFY));
    out
}

impl Filter {
    /// Compiles the BPF program for `policy` (pure, allocates; call it in the parent before
    /// `clone`).
    pub fn compile(policy: &Policy) -> Filter {
        let mut program = vec![
            stmt(LD_W_ABS, OFF_ARCH),
            jump(JMP_JEQ_K, AUDIT_ARCH_NATIVE, 1, 0),
            stmt(RET_K, RET_KILL),
            stmt(LD_W_ABS, OFF_NR),
        ];
        #[cfg(target_arch = "x86_64")]
        program.extend([
            // x32 bit set: kill, except for -1 (falls into the search and gets ENOSYS).
            jump(JMP_JSET_K, X32_SYSCALL_BIT, 0, 2),
            jump(JMP_JEQ_K, u32::MAX, 1, 0),
            stmt(RET_K, RET_KILL),
        ]);
        program.extend(search_tree(&ranges(&rules()), policy));
        assert!(program.len() <= MAX_INSNS, "seccomp program too long");
        Filter { program }
    }

    /// The BPF instructions.
    pub fn instructions(&self) -> &[sock_filter] {
        &self.program
    }

    /// Installs the filter on the calling thread with `SECCOMP_FILTER_FLAG_NEW_LISTENER` and
    /// returns the listener fd (close-on-exec), or `Err(errno)`.
    ///
    /// Async-signal-safe: no allocation and no libc wrapper, only a raw `seccomp` system call.
    /// From the moment it returns, every system call of this thread (and of everything it
    /// creates) goes through the filter: a refused call blocks until the supervisor answers
    /// it, so do only allowed calls (`sendmsg`, `close`, `dup3`, `execve`, ...) before the
    /// listener has reached the supervisor.
    ///
    /// # Safety
    /// The caller must be the single-threaded sandbox child, with `PR_SET_NO_NEW_PRIVS` already
    /// set; the filter is irrevocable for the calling thread and its descendants.
    pub unsafe fn install(&self) -> Result<i32, i32> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` points to `len` valid instructions that outlive the call (borrowed from
        // `self`); the kernel copies the program before returning.
        let ret = unsafe {
            sys::syscall3(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER as usize,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as usize,
                &prog as *const libc::sock_fprog as usize,
            )
        };
        sys::check(ret).map(|fd| fd as i32)
    }
}
