//! The seccomp-bpf system-call policy of a box, and the supervisor that answers its denials.
//!
//! # Policy
//!
//! A box runs untrusted, model-generated programs inside Linux namespaces. The filter lets
//! ordinary programs (an interpreter with threads, subprocesses, `fork`-based multiprocessing,
//! asyncio, Unix sockets, numeric libraries, a shell and coreutils) run unchanged, and refuses the
//! calls that reach kernel attack surface or host state the namespaces do not confine. It is
//! roughly Docker's default profile minus everything privileged:
//!
//! * **Allowed**: file, memory, process, signal, time, IPC, socket and event-fd calls, and calls
//!   a namespace already confines (`kill`, `pidfd_*` in the pid namespace; SysV IPC and `mq_*` in
//!   the IPC namespace) or that need a capability the box lacks (`setuid`, `capset`, `mknod`);
//!   and tracing: `ptrace`, `process_vm_readv`, `process_vm_writev` (see *Tracing* below).
//! * **Allowed after an argument check**: `clone` without namespace flags; `socket` and
//!   `socketpair` for `AF_UNIX`, `AF_INET`, `AF_INET6`, and `AF_NETLINK` with `NETLINK_ROUTE`
//!   or `NETLINK_SOCK_DIAG` (any `AF_NETLINK` protocol with [`Policy::allow_network`]; see
//!   *Networking* below); `ioctl` other than `TIOCSTI` and `TIOCLINUX` (terminal input
//!   injection); `personality` as a query (`0xffffffff`), `PER_LINUX` (`0`) or
//!   `ADDR_NO_RANDOMIZE` (gdb starts its inferiors so, as on the host).
//! * **Refused and recorded** (notified, see below; named in the verdict's
//!   `denied_syscalls`): calls shaped like an attack, which no ordinary program makes: the
//!   mount API, `unshare`/`setns`, `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`, the
//!   key-ring calls, module and `kexec` loading, clock setting, `process_madvise`, file
//!   handles, `kcmp`, `pidfd_getfd` and the other calls listed in `DENY_*` below (`EPERM`);
//!   `clone` with namespace flags, `ioctl(TIOCSTI)` and a `personality` change (`EPERM`);
//!   `socket` with a refused domain (`EAFNOSUPPORT`) or netlink protocol (`EPROTONOSUPPORT`);
//!   and every call not listed (`ENOSYS`, as if the kernel lacked it, so programs take their
//!   fallback paths).
//! * **Refused with a plain errno, unrecorded** (`SECCOMP_RET_ERRNO`, `ERRNO_PLAIN` and
//!   `PLAIN_NETLINK_PROTOCOLS` below): refusals that ordinary programs meet routinely and
//!   handle, answered with the errno the kernel itself gives an unprivileged caller or a kernel
//!   without the call, so that a passing program's verdict stays `denied_syscalls == ()`:
//!
//!   | call | errno | who makes it |
//!   |---|---|---|
//!   | `syslog` | `EPERM` | `dmesg` (the kernel's answer under `dmesg_restrict`) |
//!   | `statmount`, `listmount` | `ENOSYS` | newer util-linux (falls back to mountinfo) |
//!   | `lsm_get_self_attr`, `lsm_set_self_attr`, `lsm_list_modules` | `ENOSYS` | newer systemd, libselinux |
//!   | `socket(AF_NETLINK, NETLINK_AUDIT)` | `EPROTONOSUPPORT` | PAM, `su`, `login`, `crond` |
//!   | `clone3` | `ENOSYS` | glibc, musl (fall back to `clone`; see below) |
//!
//!   The line between the two: a call goes in the plain class only if ordinary programs make
//!   it in their normal course *and* cope with its failure; anything that only an exploit, a
//!   container runtime or a system administrator would call (namespaces, mounts, `bpf`,
//!   `kexec`, modules, key rings, `io_uring`, raw sockets) stays recorded, so that a verdict
//!   names what a hostile program tried.
//!
//! # Networking
//!
//! Every box has its own network namespace (one per slot, reused; see [`crate::net`]) with only
//! `lo` up (127.0.0.1 and ::1). `AF_INET`/`AF_INET6` sockets there reach nothing but the box
//! itself: the host's loopback is another namespace's, and every other address has no route
//! (`ENETUNREACH` before anything is sent). So they are allowed without
//! [`Policy::allow_network`] (test servers, `node`'s `listen`, Go's `httptest`), and so are
//! `NETLINK_ROUTE` (`if_nameindex`, `getifaddrs`, `ip addr`) and `NETLINK_SOCK_DIAG` (`ss`),
//! which read the private namespace; changing it needs `CAP_NET_ADMIN` over it, which the box
//! lacks (the namespace belongs to the host's user namespace). Other netlink protocols
//! (netfilter, xfrm, generic, uevents, ...) are kernel attack surface and stay refused. Raw
//! IP sockets need `CAP_NET_RAW` there, which the box lacks too.
//!
//! # Tracing
//!
//! `ptrace` is allowed, as in Docker's default profile on Linux >= 4.8: AddressSanitizer's
//! LeakSanitizer stops the world with it at exit, and strace and gdb need it. It cannot be
//! used to get past the filter: since 4.8 the kernel runs seccomp *after* the syscall-enter
//! stop, so a call a tracer rewrites is judged (and refused, and named) as the rewritten
//! call, and `PTRACE_O_SUSPEND_SECCOMP` needs `CAP_SYS_ADMIN` in the host's user namespace.
//! It cannot reach outside the box: the kernel lets a process attach only to processes of its
//! own uid that are dumpable (the box has no `CAP_SYS_PTRACE`), and a box's pid namespace holds
//! only the box's processes. The one process of the box without a filter, pid 1 (the init of
//! [`crate::init`], or the idle init of a warm run), runs as another uid and makes itself
//! non-dumpable. The warm interpreter (the parent of a warm run) is outside the pid namespace.
//! `process_vm_readv`/`writev` take the same permission check as `PTRACE_ATTACH` and give no
//! more than `PTRACE_PEEKDATA` (strace uses them), so they follow `ptrace`; `pidfd_getfd`,
//! `kcmp` and `process_madvise` stay refused.
//!
//! # Why `SECCOMP_RET_USER_NOTIF`
//!
//! Recorded refusals do not use `SECCOMP_RET_ERRNO`: they stop the calling thread and notify the
//! supervisor through the listener fd the filter was installed with ([`Filter::install`]). The
//! supervisor ([`answer_notification`]) records the system call's name and arguments and answers
//! with the errno, so a verdict can say *which* call was refused ("`ptrace` denied") instead of the
//! program merely failing with an unexplained `EPERM`. The supervisor never answers
//! `SECCOMP_USER_NOTIF_FLAG_CONTINUE`: every notified call fails without running, so there is no
//! time-of-check/time-of-use race on argument memory.
//!
//! # `clone3`
//!
//! `clone3` takes its flags in a structure in user memory, which a seccomp filter cannot read, so
//! it cannot be checked for namespace flags. It gets `SECCOMP_RET_ERRNO(ENOSYS)` directly (no
//! notification, no report): glibc, musl and other runtimes then fall back to `clone`, whose
//! flags are in a register and are checked.
//!
//! # Architecture checks
//!
//! The filter first compares `seccomp_data.arch` with the native audit architecture and kills
//! the process on any other value: system-call numbers differ between ABIs, so a 32-bit
//! (`int 0x80`, AArch32) call must never be judged by the native table. On x86_64 a call with
//! the x32 bit (`0x40000000`) set is killed too, as x32 reuses the native arch value.
//!
//! # Shape of the program
//!
//! After those checks the program is a binary search over ranges of system-call numbers that
//! share a verdict (seven levels of `JGE` for the current tables), ending in a `RET` or an inline
//! argument check.
//! Long branches go through `JA`, whose offset is 32 bits wide, so the program is valid at any
//! length. An allowed call that needs no argument check is decided from the number and arch
//! alone, so the kernel's per-filter action cache (Linux 5.11+) lets it skip the filter
//! entirely; only `clone`, `socket`, `socketpair`, `ioctl` and `personality` run the program.
//! (A tracer's rewrite of the number is judged, cached or not, by the rewritten number.)
//!
//! # Contract with the spawn pipeline
//!
//! 1. [`Filter::compile`] in the parent, before `clone`.
//! 2. In the child, after every setup step that needs a refused call (namespaces, mounts,
//!    `pivot_root`, `setns`) and after `PR_SET_NO_NEW_PRIVS`: [`Filter::install`], then
//!    [`send_fd`] of the listener over a socket to the parent, then `close` it, then `execve`.
//!    Between `install` and the listener reaching the parent, make only allowed calls: a refused
//!    one would block on a supervisor that does not have the listener yet.
//! 3. The box must never hold the listener: a thread with it could answer its own notifications
//!    with `CONTINUE`. It is created close-on-exec, and the child closes it explicitly as well.
//! 4. The parent takes it with [`recv_fd`], polls it next to its other fds and calls
//!    [`answer_notification`] (which never blocks) whenever it is readable, for as long as the
//!    box lives. A notified thread waits until answered (a signal interrupts the wait and the
//!    call is restarted and notified again; `SIGKILL` ends it). If the listener is closed, every
//!    call the filter would notify fails with `ENOSYS`, unreported.
//! 5. `install` fails with `EBUSY` when a filter already on the thread (say, from a container
//!    runtime the engine runs under) has a listener of its own: a thread can have only one.

use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use libc::{c_int, c_long, c_void, sock_filter};

use crate::sys;
use syscalls::nr;

// The name table lives next to this file (`src/syscalls.rs`) but is a child of this module, so
// the crate root does not declare it.
#[path = "syscalls.rs"]
mod syscalls;

/// What a box may do beyond the fixed part of the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// The box shares the host's network: allow `AF_NETLINK` sockets of any protocol. (`AF_UNIX`,
    /// `AF_INET`, `AF_INET6` and the read-only netlink protocols are always allowed: without
    /// this, the box's network namespace is private.)
    pub allow_network: bool,
}

/// A compiled seccomp-bpf program.
#[derive(Debug, Clone)]
pub struct Filter {
    program: Vec<sock_filter>,
}

/// A refused system call, as reported by [`answer_notification`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// System-call number (native architecture).
    pub nr: i64,
    /// Kernel name (`"ptrace"`), or `"syscall_<nr>"` for a number this crate does not know.
    pub name: String,
    /// The six raw arguments.
    pub args: [u64; 6],
    /// The errno the call failed with.
    pub errno: i32,
}

// ---------------------------------------------------------------------------------------------
// Policy tables
// ---------------------------------------------------------------------------------------------

/// Allowed without argument checks on every supported architecture.
const ALLOW_COMMON: &[c_long] = &[
    // File descriptors and I/O.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_lseek,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_sendfile,
    libc::SYS_splice,
    libc::SYS_tee,
    libc::SYS_vmsplice,
    libc::SYS_copy_file_range,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync,
    libc::SYS_syncfs,
    libc::SYS_truncate,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fadvise64,
    libc::SYS_readahead,
    libc::SYS_pipe2,
    libc::SYS_memfd_create,
    nr::SYS_cachestat,
    // Files and directories.
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_getdents64,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_unlinkat,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_renameat2,
    libc::SYS_readlinkat,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_utimensat,
    libc::SYS_umask,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    nr::SYS_setxattrat,
    nr::SYS_getxattrat,
    nr::SYS_listxattrat,
    nr::SYS_removexattrat,
    nr::SYS_file_getattr,
    nr::SYS_file_setattr,
    // Polling and event fds.
    libc::SYS_pselect6,
    libc::SYS_ppoll,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_signalfd4,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    // Asynchronous I/O (the old interface; io_uring is refused).
    libc::SYS_io_setup,
    libc::SYS_io_destroy,
    libc::SYS_io_submit,
    libc::SYS_io_cancel,
    libc::SYS_io_getevents,
    // Memory.
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_msync,
    libc::SYS_mincore,
    libc::SYS_madvise,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_munlock,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_remap_file_pages,
    libc::SYS_mbind,
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_move_pages,
    libc::SYS_membarrier,
    libc::SYS_pkey_mprotect,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_mseal,
    nr::SYS_map_shadow_stack,
    // Processes and threads.
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_set_tid_address,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_futex,
    libc::SYS_futex_waitv,
    nr::SYS_futex_wake,
    nr::SYS_futex_wait,
    nr::SYS_futex_requeue,
    libc::SYS_restart_syscall,
    libc::SYS_prctl,
    libc::SYS_seccomp,
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_add_rule,
    libc::SYS_landlock_restrict_self,
    libc::SYS_getrandom,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_getrusage,
    libc::SYS_times,
    libc::SYS_getcpu,
    // Identity (changing it needs capabilities the box does not have).
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_gettid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
    libc::SYS_capget,
    libc::SYS_capset,
    libc::SYS_setpgid,
    libc::SYS_getpgid,
    libc::SYS_getsid,
    libc::SYS_setsid,
    // Scheduling.
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_setparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_sched_getattr,
    libc::SYS_sched_setattr,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_ioprio_get,
    libc::SYS_ioprio_set,
    // Signals (the pid namespace confines the targets).
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_sigaltstack,
    libc::SYS_kill,
    libc::SYS_tkill,
    libc::SYS_tgkill,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    // Time and timers.
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_getitimer,
    libc::SYS_setitimer,
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_gettime,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_delete,
    // Tracing, confined to the box: see the module doc. `process_vm_*` take the same
    // permission check as `PTRACE_ATTACH` and give no more than `PTRACE_PEEKDATA` does
    // (strace reads its tracees' memory with them).
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    // Sockets (creation is checked separately).
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    // SysV and POSIX IPC (the IPC namespace confines them).
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_semtimedop,
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmdt,
    libc::SYS_shmctl,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
];

/// Allowed without argument checks, x86_64 only (legacy calls the generic table dropped).
#[cfg(target_arch = "x86_64")]
const ALLOW_ARCH: &[c_long] = &[
    libc::SYS_arch_prctl,
    libc::SYS_open,
    libc::SYS_creat,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_poll,
    libc::SYS_select,
    libc::SYS_pipe,
    libc::SYS_dup2,
    libc::SYS_pause,
    libc::SYS_alarm,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_getdents,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_mkdir,
    libc::SYS_rmdir,
    libc::SYS_link,
    libc::SYS_unlink,
    libc::SYS_symlink,
    libc::SYS_readlink,
    libc::SYS_chmod,
    libc::SYS_fchmodat2,
    libc::SYS_chown,
    libc::SYS_lchown,
    libc::SYS_mknod,
    libc::SYS_utime,
    libc::SYS_utimes,
    libc::SYS_futimesat,
    libc::SYS_sync_file_range,
    libc::SYS_getrlimit,
    libc::SYS_getpgrp,
    libc::SYS_time,
    libc::SYS_epoll_create,
    libc::SYS_epoll_wait,
    libc::SYS_eventfd,
    libc::SYS_signalfd,
    libc::SYS_inotify_init,
    nr::SYS_io_pgetevents,
];

/// Allowed without argument checks, aarch64 only (numbers the `libc` crate lacks there).
#[cfg(target_arch = "aarch64")]
const ALLOW_ARCH: &[c_long] = &[
    nr::SYS_renameat,
    nr::SYS_fchmodat2,
    nr::SYS_sync_file_range,
    nr::SYS_getrlimit,
    nr::SYS_io_pgetevents,
];

/// Refused with `EPERM` on every supported architecture: privileged, host-global, or large
/// kernel attack surface that no ordinary program needs.
const DENY_COMMON: &[c_long] = &[
    // Reaching into other processes beyond what `ptrace` gives (which is allowed: see the
    // module doc).
    libc::SYS_process_madvise,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    // Mounts and namespaces.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    nr::SYS_open_tree_attr,
    libc::SYS_mount_setattr,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_fanotify_init,
    libc::SYS_fanotify_mark,
    libc::SYS_nfsservctl,
    libc::SYS_lookup_dcookie,
    // Kernel attack surface.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    // Whole-machine state.
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_vhangup,
];

/// Refused with `EPERM`, x86_64 only.
#[cfg(target_arch = "x86_64")]
const DENY_ARCH: &[c_long] = &[
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_modify_ldt,
    libc::SYS_uselib,
];

/// Refused with `EPERM`, aarch64 only.
#[cfg(target_arch = "aarch64")]
const DENY_ARCH: &[c_long] = &[];

/// Refused with a plain `SECCOMP_RET_ERRNO`, unreported (not in the verdict's
/// `denied_syscalls`), with the errno the kernel itself gives an unprivileged caller or a
/// kernel without the call: refusals that ordinary programs meet routinely and handle. See
/// the module doc for the classification.
const ERRNO_PLAIN: &[(c_long, i32)] = &[
    // `dmesg`: the kernel refuses an unprivileged read under `dmesg_restrict` the same way.
    (libc::SYS_syslog, libc::EPERM),
    // Probed by newer util-linux, systemd and libselinux, which fall back (to
    // /proc/self/mountinfo, /proc/self/attr) on kernels without them.
    (nr::SYS_statmount, libc::ENOSYS),
    (nr::SYS_listmount, libc::ENOSYS),
    (nr::SYS_lsm_get_self_attr, libc::ENOSYS),
    (nr::SYS_lsm_set_self_attr, libc::ENOSYS),
    (nr::SYS_lsm_list_modules, libc::ENOSYS),
];

/// Namespace flags that `clone` may not carry.
const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u32;

/// Socket domains allowed without [`Policy::allow_network`]: the box's network namespace is
/// private (only `lo`), so IP sockets reach nothing but the box itself.
const LOCAL_DOMAINS: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
];

/// `AF_NETLINK` protocols allowed without [`Policy::allow_network`]: `NETLINK_ROUTE` only
/// (interfaces, addresses and routes of the private namespace; changing them needs
/// `CAP_NET_ADMIN` over it, which the box lacks).
const LOCAL_NETLINK_PROTOCOLS: &[u32] = &[
    libc::NETLINK_ROUTE as u32,
    // `ss`: the sockets of the private namespace, as /proc/net/{tcp,udp,unix} show them
    // (destroying one needs CAP_NET_ADMIN).
    libc::NETLINK_SOCK_DIAG as u32,
];

/// `AF_NETLINK` protocols refused with a plain `EPROTONOSUPPORT` (unreported) without
/// [`Policy::allow_network`]: `NETLINK_AUDIT`, which PAM, `su`, `login` and `crond` open to log
/// and which the kernel refuses that way when built without audit. Every other protocol is
/// notified (and answered `EPROTONOSUPPORT`).
const PLAIN_NETLINK_PROTOCOLS: &[u32] = &[libc::NETLINK_AUDIT as u32];

/// Socket domains allowed with [`Policy::allow_network`].
const NETWORK_DOMAINS: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
    libc::AF_NETLINK as u32,
];

/// Terminal ioctls that inject input or drive the console.
const REFUSED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// `personality` arguments allowed: a query (`0xffffffff`), `PER_LINUX` (`0`), and
/// `PER_LINUX | ADDR_NO_RANDOMIZE`, which gdb (and `setarch -R`) set for the programs they
/// start: address-space randomisation only guards a process against exploits of its own bugs,
/// and every process of the box is the box's own.
const ALLOWED_PERSONAS: &[u32] = &[0, 0xffff_ffff, ADDR_NO_RANDOMIZE];

/// `ADDR_NO_RANDOMIZE` of `<linux/personality.h>`.
const ADDR_NO_RANDOMIZE: u32 = 0x0040000;

/// The errno the supervisor answers a notification for system call `nr` with arguments
/// `args` with.
fn denial_errno(nr: c_long, args: &[u64; 6]) -> i32 {
    match nr {
        // A netlink protocol the box may not open: what the kernel says of one it lacks.
        libc::SYS_socket | libc::SYS_socketpair if args[0] as u32 == libc::AF_NETLINK as u32 => {
            libc::EPROTONOSUPPORT
        }
        libc::SYS_socket | libc::SYS_socketpair => libc::EAFNOSUPPORT,
        libc::SYS_clone | libc::SYS_ioctl | libc::SYS_personality => libc::EPERM,
        _ if DENY_COMMON.contains(&nr) || DENY_ARCH.contains(&nr) => libc::EPERM,
        _ => libc::ENOSYS,
    }
}

/// Kernel name of system call `nr` on the native architecture, if this crate knows it.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    syscalls::name(nr)
}

// ---------------------------------------------------------------------------------------------
// Classic BPF encoding
// ---------------------------------------------------------------------------------------------

/// `BPF_LD | BPF_W | BPF_ABS`: load the 32-bit word at offset `k` of `seccomp_data`.
const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// `BPF_JMP | BPF_JA`: jump forward `k` instructions.
const JMP_JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const JMP_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JGE | BPF_K` (unsigned).
const JMP_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JSET | BPF_K`.
const JMP_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
/// `BPF_RET | BPF_K`.
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

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

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

const OFF_NR: u32 = offset_of!(libc::seccomp_data, nr) as u32;
const OFF_ARCH: u32 = offset_of!(libc::seccomp_data, arch) as u32;

/// Offset of the low 32 bits of argument `i` in `seccomp_data`.
const fn arg_low(i: usize) -> u32 {
    let base = offset_of!(libc::seccomp_data, args) + 8 * i;
    if cfg!(target_endian = "big") {
        (base + 4) as u32
    } else {
        base as u32
    }
}

fn stmt(code: u16, k: u32) -> sock_filter {
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
enum Leaf {
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
const SYS_SETRLIMIT: c_long = libc::SYS_setrlimit;
#[cfg(target_arch = "aarch64")]
const SYS_SETRLIMIT: c_long = nr::SYS_setrlimit;

/// `RET_ERRNO` with errno 0: the call returns 0 without running.
const RET_SUCCEED: u32 = libc::SECCOMP_RET_ERRNO;

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
fn search_tree(ranges: &[(u32, Leaf)], policy: &Policy) -> Vec<sock_filter> {
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
fn rules() -> Vec<(u32, Leaf)> {
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
fn ranges(rules: &[(u32, Leaf)]) -> Vec<(u32, Leaf)> {
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

// ---------------------------------------------------------------------------------------------
// Passing the listener to the supervisor
// ---------------------------------------------------------------------------------------------

/// A control message carrying exactly one fd: `CMSG_SPACE(sizeof(int))` bytes, laid out as the
/// kernel expects (`cmsghdr` is 8-byte aligned and 16 bytes long on 64-bit Linux).
#[repr(C)]
struct OneFdCmsg {
    hdr: libc::cmsghdr,
    fd: c_int,
}

// SAFETY: CMSG_LEN only does arithmetic on its argument.
const ONE_FD_CMSG_LEN: u32 = unsafe { libc::CMSG_LEN(size_of::<c_int>() as u32) };

/// Sends `fd` over the connected `AF_UNIX` socket `sock` with `SCM_RIGHTS`, along with one data
/// byte. Returns the raw `sendmsg` result (`1`, or `-errno`); retries on `EINTR`.
///
/// Async-signal-safe: the control message lives on the stack and the call is a raw system call.
///
/// # Safety
/// `sock` and `fd` must be file descriptors the caller owns (the call does not take ownership).
pub unsafe fn send_fd(sock: i32, fd: i32) -> isize {
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast::<c_void>(),
        iov_len: 1,
    };
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut cmsg: OneFdCmsg = unsafe { std::mem::zeroed() };
    cmsg.hdr.cmsg_len = ONE_FD_CMSG_LEN as _;
    cmsg.hdr.cmsg_level = libc::SOL_SOCKET;
    cmsg.hdr.cmsg_type = libc::SCM_RIGHTS;
    cmsg.fd = fd;
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = (&mut cmsg as *mut OneFdCmsg).cast::<c_void>();
    msg.msg_controllen = size_of::<OneFdCmsg>() as _;
    loop {
        // SAFETY: `msg` and everything it points to live on this stack frame for the call.
        let ret = unsafe {
            sys::syscall3(
                libc::SYS_sendmsg,
                sock as usize,
                &msg as *const libc::msghdr as usize,
                libc::MSG_NOSIGNAL as usize,
            )
        };
        if ret != -(libc::EINTR as isize) {
            return ret;
        }
    }
}

/// Receives one fd sent by [`send_fd`] from `sock` (with `MSG_CMSG_CLOEXEC`).
///
/// Fails with `UnexpectedEof` if the peer closed the socket without sending one, and with
/// `InvalidData` (closing whatever arrived) if the message carried anything but exactly one fd.
pub fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    const MAX_FDS: usize = 8;
    // 8-byte aligned room for a control message of up to MAX_FDS fds.
    let mut control = [0u64; (16 + MAX_FDS * size_of::<c_int>()).div_ceil(8)];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast::<c_void>(),
        iov_len: byte.len(),
    };
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast::<c_void>();
    msg.msg_controllen = size_of_val(&control) as _;

    let received = loop {
        // SAFETY: `msg` points to live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };

    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: `msg` was filled by recvmsg; the CMSG_* helpers stay within msg_controllen.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: non-null headers returned by CMSG_FIRSTHDR/NXTHDR lie inside `control`.
        let hdr = unsafe { std::ptr::read_unaligned(cmsg) };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: as above; CMSG_LEN(0) is arithmetic.
            let (data, header_len) = unsafe { (libc::CMSG_DATA(cmsg), libc::CMSG_LEN(0)) };
            let count =
                (hdr.cmsg_len as usize).saturating_sub(header_len as usize) / size_of::<c_int>();
            for i in 0..count {
                // SAFETY: the kernel wrote `count` fds after the header, inside `control`.
                let raw = unsafe { std::ptr::read_unaligned(data.cast::<c_int>().add(i)) };
                // SAFETY: SCM_RIGHTS installed `raw` in this process for us to own.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: `cmsg` is a valid header inside `msg`'s control buffer.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }

    if received == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the socket without sending an fd",
        ));
    }
    if fds.len() != 1 || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected one fd, received {} (flags {:#x})",
                fds.len(),
                msg.msg_flags
            ),
        ));
    }
    Ok(fds.pop().expect("one fd"))
}

// ---------------------------------------------------------------------------------------------
// Supervisor
// ---------------------------------------------------------------------------------------------

/// `ioctl` on the listener, retrying on `EINTR`.
fn listener_ioctl<T>(fd: c_int, request: libc::Ioctl, arg: *mut T) -> io::Result<()> {
    loop {
        // SAFETY: `arg` points to a live value of the type `request` expects.
        if unsafe { libc::ioctl(fd, request, arg) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Answers one pending notification on `listener`, never blocking.
///
/// Call it when `poll` reports the listener readable (looping until it returns `Ok(None)` is
/// fine). Receives one notification with `SECCOMP_IOCTL_NOTIF_RECV`, fails the system call with
/// `SECCOMP_IOCTL_NOTIF_SEND` (`EPERM`, `EAFNOSUPPORT` for a refused socket domain, `ENOSYS` for
/// an unlisted call; never `CONTINUE`) and returns what was refused. `Ok(None)` when nothing is
/// pending or the calling thread vanished (was killed or interrupted) before the answer.
pub fn answer_notification(listener: BorrowedFd<'_>) -> io::Result<Option<Denial>> {
    let fd = listener.as_raw_fd();
    // NOTIF_RECV blocks while nothing is pending, so look first.
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 0) } >= 0 {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    if pfd.revents & libc::POLLIN == 0 {
        return Ok(None);
    }

    // SAFETY: all-zero is a valid seccomp_notif, and the kernel requires it zeroed.
    let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    match listener_ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut notif) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    }

    let nr = i64::from(notif.data.nr);
    let errno = denial_errno(nr, &notif.data.args);
    let mut resp = libc::seccomp_notif_resp {
        id: notif.id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    match listener_ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    }
    Ok(Some(Denial {
        nr,
        name: syscall_name(nr).map_or_else(|| format!("syscall_{nr}"), str::to_owned),
        args: notif.data.args,
        errno,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    // -----------------------------------------------------------------------------------------
    // A classic-BPF interpreter for the instructions the compiler emits.
    // -----------------------------------------------------------------------------------------

    fn data(arch: u32, nr: i64, args: [u64; 6]) -> libc::seccomp_data {
        libc::seccomp_data {
            nr: nr as i32,
            arch,
            instruction_pointer: 0x7000_1234,
            args,
        }
    }

    /// Runs `prog` on `d`; returns the action and the number of instructions executed.
    fn run(prog: &[sock_filter], d: &libc::seccomp_data) -> (u32, usize) {
        let mut bytes = [0u8; size_of::<libc::seccomp_data>()];
        bytes[0..4].copy_from_slice(&d.nr.to_ne_bytes());
        bytes[4..8].copy_from_slice(&d.arch.to_ne_bytes());
        bytes[8..16].copy_from_slice(&d.instruction_pointer.to_ne_bytes());
        for (i, a) in d.args.iter().enumerate() {
            bytes[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
        loop {
            let ins = prog[pc];
            steps += 1;
            let cond = |c: bool| 1 + usize::from(if c { ins.jt } else { ins.jf });
            match ins.code {
                LD_W_ABS => {
                    let k = ins.k as usize;
                    assert!(k % 4 == 0 && k + 4 <= bytes.len(), "bad load offset {k}");
                    acc = u32::from_ne_bytes(bytes[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                JMP_JA => pc += 1 + ins.k as usize,
                JMP_JEQ_K => pc += cond(acc == ins.k),
                JMP_JGE_K => pc += cond(acc >= ins.k),
                JMP_JSET_K => pc += cond(acc & ins.k != 0),
                RET_K => return (ins.k, steps),
                code => panic!("unexpected opcode {code:#x} at {pc}"),
            }
        }
    }

    fn action(policy: Policy, nr: i64, args: [u64; 6]) -> u32 {
        run(
            Filter::compile(&policy).instructions(),
            &data(AUDIT_ARCH_NATIVE, nr, args),
        )
        .0
    }

    const NONE: [u64; 6] = [0; 6];
    const DEFAULT: Policy = Policy {
        allow_network: false,
    };
    const NETWORK: Policy = Policy {
        allow_network: true,
    };

    /// The verdict the tables say a call with no argument check should get.
    fn expected_plain(nr: c_long) -> u32 {
        if ALLOW_COMMON.contains(&nr) || ALLOW_ARCH.contains(&nr) {
            RET_ALLOW
        } else if nr == libc::SYS_clone3 {
            RET_ENOSYS
        } else if let Some(&(_, errno)) = ERRNO_PLAIN.iter().find(|&&(n, _)| n == nr) {
            libc::SECCOMP_RET_ERRNO | errno as u32
        } else {
            RET_NOTIFY
        }
    }

    const CHECKED: &[c_long] = &[
        SYS_SETRLIMIT,
        libc::SYS_prlimit64,
        libc::SYS_clone,
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_ioctl,
        libc::SYS_personality,
    ];

    #[test]
    fn every_number_gets_the_table_verdict() {
        for policy in [DEFAULT, NETWORK] {
            let filter = Filter::compile(&policy);
            for nr in 0..2048 {
                if CHECKED.contains(&nr) {
                    continue;
                }
                let got = run(filter.instructions(), &data(AUDIT_ARCH_NATIVE, nr, NONE)).0;
                assert_eq!(got, expected_plain(nr), "nr {nr} ({:?})", syscall_name(nr));
            }
        }
    }

    #[test]
    fn named_examples() {
        for nr in [
            libc::SYS_read,
            libc::SYS_mmap,
            libc::SYS_futex,
            libc::SYS_rseq,
            libc::SYS_getrandom,
            libc::SYS_statx,
            libc::SYS_newfstatat,
            libc::SYS_faccessat2,
            libc::SYS_prlimit64,
            libc::SYS_sched_getaffinity,
            libc::SYS_set_robust_list,
            libc::SYS_execve,
            libc::SYS_wait4,
            libc::SYS_membarrier,
            libc::SYS_mbind,
            libc::SYS_pidfd_open,
            libc::SYS_memfd_create,
            libc::SYS_restart_syscall,
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
        ] {
            assert_eq!(
                action(DEFAULT, nr, NONE),
                RET_ALLOW,
                "{:?}",
                syscall_name(nr)
            );
        }
        for nr in [
            libc::SYS_mount,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_bpf,
            libc::SYS_keyctl,
            libc::SYS_io_uring_setup,
            libc::SYS_userfaultfd,
            libc::SYS_perf_event_open,
            libc::SYS_process_madvise,
            libc::SYS_pidfd_getfd,
            libc::SYS_kexec_load,
            libc::SYS_init_module,
            libc::SYS_open_by_handle_at,
        ] {
            assert_eq!(
                action(DEFAULT, nr, NONE),
                RET_NOTIFY,
                "{:?}",
                syscall_name(nr)
            );
            assert_eq!(
                denial_errno(nr, &NONE),
                libc::EPERM,
                "{:?}",
                syscall_name(nr)
            );
        }
        #[cfg(target_arch = "x86_64")]
        for nr in [
            libc::SYS_arch_prctl,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_open,
            libc::SYS_poll,
        ] {
            assert_eq!(
                action(DEFAULT, nr, NONE),
                RET_ALLOW,
                "{:?}",
                syscall_name(nr)
            );
        }
        #[cfg(target_arch = "x86_64")]
        for nr in [libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_modify_ldt] {
            assert_eq!(action(DEFAULT, nr, NONE), RET_NOTIFY);
            assert_eq!(denial_errno(nr, &NONE), libc::EPERM);
        }
        assert_eq!(action(DEFAULT, libc::SYS_clone3, NONE), RET_ENOSYS);
        for (nr, errno) in [
            (libc::SYS_syslog, libc::EPERM),
            (nr::SYS_statmount, libc::ENOSYS),
            (nr::SYS_listmount, libc::ENOSYS),
            (nr::SYS_lsm_list_modules, libc::ENOSYS),
        ] {
            assert_eq!(
                action(DEFAULT, nr, NONE),
                libc::SECCOMP_RET_ERRNO | errno as u32
            );
        }
        for nr in [
            libc::SYS_memfd_secret,
            1000,
            100_000,
            i64::from(i32::MAX >> 2) - 1,
        ] {
            assert_eq!(action(DEFAULT, nr, NONE), RET_NOTIFY);
            assert_eq!(denial_errno(nr, &NONE), libc::ENOSYS);
        }
    }

    #[test]
    fn foreign_architectures_are_killed() {
        const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
        const AUDIT_ARCH_ARM: u32 = 40 | 0x4000_0000;
        const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
        const AUDIT_ARCH_AARCH64: u32 = 183 | 0x8000_0000 | 0x4000_0000;
        const AUDIT_ARCH_RISCV64: u32 = 243 | 0x8000_0000 | 0x4000_0000;
        let filter = Filter::compile(&NETWORK);
        for arch in [
            AUDIT_ARCH_I386,
            AUDIT_ARCH_ARM,
            AUDIT_ARCH_X86_64,
            AUDIT_ARCH_AARCH64,
            AUDIT_ARCH_RISCV64,
            0,
        ] {
            if arch == AUDIT_ARCH_NATIVE {
                continue;
            }
            for nr in [0, 1, 3, 11, 56, 63, 64, 101, 220, 435, 1000] {
                let (got, steps) = run(filter.instructions(), &data(arch, nr, NONE));
                assert_eq!(got, RET_KILL, "arch {arch:#x} nr {nr}");
                assert_eq!(steps, 3);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_calls_are_killed() {
        let filter = Filter::compile(&DEFAULT);
        for nr in [
            0x4000_0000_i64,
            0x4000_0000 | libc::SYS_read,
            0x4000_0000 | 512,
            0x7fff_ffff,
        ] {
            assert_eq!(
                run(filter.instructions(), &data(AUDIT_ARCH_NATIVE, nr, NONE)).0,
                RET_KILL
            );
        }
        // -1 is not x32: refused as an unknown call.
        assert_eq!(
            run(filter.instructions(), &data(AUDIT_ARCH_NATIVE, -1, NONE)).0,
            RET_NOTIFY
        );
    }

    #[test]
    fn clone_namespace_flags() {
        let sigchld = libc::SIGCHLD as u64;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64 | sigchld;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | sigchld;
        for flags in [
            0,
            sigchld,
            thread,
            fork,
            vfork,
            libc::CLONE_PIDFD as u64 | sigchld,
        ] {
            assert_eq!(
                action(DEFAULT, libc::SYS_clone, [flags, 0, 0, 0, 0, 0]),
                RET_ALLOW,
                "{flags:#x}"
            );
        }
        for ns in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWCGROUP,
        ] {
            let flags = ns as u64 | sigchld;
            for policy in [DEFAULT, NETWORK] {
                assert_eq!(
                    action(policy, libc::SYS_clone, [flags, 0, 0, 0, 0, 0]),
                    RET_NOTIFY,
                    "{flags:#x}"
                );
            }
            // Bits above 31 are ignored by the kernel and by the filter.
            assert_eq!(
                action(DEFAULT, libc::SYS_clone, [flags << 32, 0, 0, 0, 0, 0]),
                RET_ALLOW
            );
        }
        assert_eq!(denial_errno(libc::SYS_clone, &NONE), libc::EPERM);
    }

    #[test]
    fn socket_domains() {
        for nr in [libc::SYS_socket, libc::SYS_socketpair] {
            let dom = |d: c_int| [d as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
            for policy in [DEFAULT, NETWORK] {
                assert_eq!(action(policy, nr, dom(libc::AF_UNIX)), RET_ALLOW);
                // Only the low 32 bits count (the kernel takes an int).
                assert_eq!(
                    action(policy, nr, [1 << 32 | libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
                    RET_ALLOW
                );
                for d in [
                    libc::AF_PACKET,
                    libc::AF_BLUETOOTH,
                    libc::AF_ALG,
                    libc::AF_VSOCK,
                    libc::AF_KEY,
                    0,
                    -1,
                ] {
                    assert_eq!(action(policy, nr, dom(d)), RET_NOTIFY, "domain {d}");
                }
            }
            for policy in [DEFAULT, NETWORK] {
                for d in [libc::AF_INET, libc::AF_INET6] {
                    assert_eq!(action(policy, nr, dom(d)), RET_ALLOW, "domain {d}");
                    // High bits of the domain are ignored, as by the kernel.
                    let high = [0xffff_0000_0000_0000 | d as u64, 1, 0, 0, 0, 0];
                    assert_eq!(action(policy, nr, high), RET_ALLOW, "domain {d}");
                }
            }
            // Netlink: NETLINK_ROUTE only in the private namespace, any protocol with network.
            let netlink = |proto: u64| {
                [
                    libc::AF_NETLINK as u64,
                    libc::SOCK_RAW as u64,
                    proto,
                    0,
                    0,
                    0,
                ]
            };
            assert_eq!(action(DEFAULT, nr, netlink(0)), RET_ALLOW);
            assert_eq!(action(DEFAULT, nr, netlink(1 << 32)), RET_ALLOW);
            assert_eq!(
                action(DEFAULT, nr, netlink(libc::NETLINK_SOCK_DIAG as u64)),
                RET_ALLOW
            );
            let plain = libc::SECCOMP_RET_ERRNO | libc::EPROTONOSUPPORT as u32;
            assert_eq!(
                action(DEFAULT, nr, netlink(libc::NETLINK_AUDIT as u64)),
                plain
            );
            assert_eq!(
                action(NETWORK, nr, netlink(libc::NETLINK_AUDIT as u64)),
                RET_ALLOW
            );
            // The plain errno is for netlink only: AF_INET with protocol 9 is still allowed,
            // AF_PACKET with it still notified.
            assert_eq!(action(DEFAULT, nr, [2, 1, 9, 0, 0, 0]), RET_ALLOW);
            assert_eq!(
                action(DEFAULT, nr, [libc::AF_PACKET as u64, 3, 9, 0, 0, 0]),
                RET_NOTIFY
            );
            for proto in [
                libc::NETLINK_NETFILTER,
                libc::NETLINK_GENERIC,
                libc::NETLINK_KOBJECT_UEVENT,
                libc::NETLINK_XFRM,
                libc::NETLINK_CONNECTOR,
                -1,
            ] {
                assert_eq!(
                    action(DEFAULT, nr, netlink(proto as u32 as u64)),
                    RET_NOTIFY
                );
                assert_eq!(action(NETWORK, nr, netlink(proto as u32 as u64)), RET_ALLOW);
            }
            // A protocol that is NETLINK_ROUTE's number does not open another domain.
            assert_eq!(
                action(DEFAULT, nr, [libc::AF_PACKET as u64, 3, 0, 0, 0, 0]),
                RET_NOTIFY
            );
            assert_eq!(denial_errno(nr, &NONE), libc::EAFNOSUPPORT);
            assert_eq!(denial_errno(nr, &netlink(9)), libc::EPROTONOSUPPORT);
        }
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // the ioctl request type differs between libcs
    fn ioctl_requests() {
        let req = |r: u64| [0, r, 0, 0, 0, 0];
        for r in [libc::TIOCSTI, libc::TIOCLINUX] {
            let r = r as u64;
            assert_eq!(action(DEFAULT, libc::SYS_ioctl, req(r)), RET_NOTIFY);
            assert_eq!(
                action(DEFAULT, libc::SYS_ioctl, req(0xffff_ffff_0000_0000 | r)),
                RET_NOTIFY
            );
        }
        for r in [
            libc::TCGETS,
            libc::TIOCGWINSZ,
            libc::FIONREAD,
            libc::FIOCLEX,
            libc::TIOCSCTTY,
        ] {
            assert_eq!(action(DEFAULT, libc::SYS_ioctl, req(r as u64)), RET_ALLOW);
        }
        assert_eq!(denial_errno(libc::SYS_ioctl, &NONE), libc::EPERM);
    }

    #[test]
    fn the_core_limit_cannot_change() {
        let core = PINNED_RLIMIT as u64;
        let set = |res: u64| action(DEFAULT, SYS_SETRLIMIT, [res, 0x1000, 0, 0, 0, 0]);
        assert_eq!(set(core), RET_SUCCEED);
        assert_eq!(set(1 << 32 | core), RET_SUCCEED);
        for res in [0, 3, 7, 5] {
            assert_eq!(set(res), RET_ALLOW, "resource {res}");
        }
        let pr = |res: u64, new: u64, old: u64| {
            action(DEFAULT, libc::SYS_prlimit64, [0, res, new, old, 0, 0])
        };
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        assert_eq!(pr(core, 0, 0x1000), RET_ALLOW); // getrlimit
        assert_eq!(pr(core, 0, 0), RET_ALLOW);
        assert_eq!(pr(core, 0x1000, 0), RET_SUCCEED); // glibc's setrlimit
        assert_eq!(pr(core, 1 << 32, 0), RET_SUCCEED); // a pointer above 4 GiB
        assert_eq!(pr(core, 0x1000, 0x2000), eperm);
        assert_eq!(pr(core, 0x1000, 1 << 40), eperm);
        for res in [0, 3, 7] {
            assert_eq!(pr(res, 0x1000, 0x2000), RET_ALLOW, "resource {res}");
        }
    }

    #[test]
    fn personality_queries_only() {
        let arg = |p: u64| [p, 0, 0, 0, 0, 0];
        for p in [0, 0xffff_ffff, u64::MAX, 0x0040000, 0xffff_ffff_0004_0000] {
            assert_eq!(
                action(DEFAULT, libc::SYS_personality, arg(p)),
                RET_ALLOW,
                "{p:#x}"
            );
        }
        for p in [8, 0x0040008, 0x0400000, 0x0440000, 1] {
            assert_eq!(
                action(DEFAULT, libc::SYS_personality, arg(p)),
                RET_NOTIFY,
                "{p:#x}"
            );
        }
        assert_eq!(denial_errno(libc::SYS_personality, &NONE), libc::EPERM);
    }

    #[test]
    fn tables_are_consistent() {
        let rules = rules();
        assert!(
            rules.windows(2).all(|w| w[0].0 < w[1].0),
            "duplicate system call"
        );
        for &(nr, _) in &rules {
            assert!(syscall_name(i64::from(nr)).is_some(), "unnamed nr {nr}");
        }
        let allowed = ALLOW_COMMON.len() + ALLOW_ARCH.len();
        let denied = DENY_COMMON.len() + DENY_ARCH.len();
        println!(
            "{allowed} allowed, {} checked, {denied} refused (EPERM), {} ranges, {} instructions",
            CHECKED.len(),
            ranges(&rules).len(),
            Filter::compile(&NETWORK).instructions().len()
        );
    }

    #[test]
    fn description_matches_the_tables() {
        let local = describe(&DEFAULT);
        assert!(local.allow.contains(&"ptrace") && local.allow.contains(&"process_vm_readv"));
        assert!(local.deny.contains(&"mount") && !local.deny.contains(&"syslog"));
        assert_eq!(local.errno, vec![("syslog", libc::EPERM)]);
        for n in ["clone3", "statmount", "listmount", "lsm_list_modules"] {
            assert!(local.enosys.contains(&n), "{n}");
        }
        assert_eq!(local.socket_domains, LOCAL_DOMAINS);
        assert_eq!(
            local.netlink_protocols.as_deref(),
            Some(LOCAL_NETLINK_PROTOCOLS)
        );
        assert_eq!(local.plain_netlink_protocols, PLAIN_NETLINK_PROTOCOLS);
        assert!(local.personalities.contains(&ADDR_NO_RANDOMIZE));
        let net = describe(&NETWORK);
        assert_eq!(net.socket_domains, NETWORK_DOMAINS);
        assert_eq!(net.netlink_protocols, None);
        assert!(net.plain_netlink_protocols.is_empty());
    }

    #[test]
    fn allow_path_is_short() {
        let filter = Filter::compile(&DEFAULT);
        let mut worst = 0;
        let mut total = 0;
        let allowed: Vec<c_long> = ALLOW_COMMON.iter().chain(ALLOW_ARCH).copied().collect();
        for &nr in &allowed {
            let (got, steps) = run(filter.instructions(), &data(AUDIT_ARCH_NATIVE, nr, NONE));
            assert_eq!(got, RET_ALLOW);
            worst = worst.max(steps);
            total += steps;
        }
        println!(
            "allow path: worst {worst}, mean {:.1} instructions",
            total as f64 / allowed.len() as f64
        );
        assert!(worst <= 20, "worst allow path {worst}");
    }

    #[test]
    fn long_programs_use_wide_jumps() {
        // 3000 alternating ranges make subtrees far longer than an 8-bit jump.
        let leaves = [
            Leaf::Ret(RET_ALLOW),
            Leaf::Socket,
            Leaf::Ret(RET_NOTIFY),
            Leaf::Ioctl,
        ];
        let ranges: Vec<(u32, Leaf)> = (0..3000u32)
            .map(|i| (i * 2, leaves[i as usize % 4]))
            .collect();
        let mut prog = vec![stmt(LD_W_ABS, OFF_NR)];
        prog.extend(search_tree(&ranges, &DEFAULT));
        assert!(prog.len() > 4 * 255);
        assert!(prog.iter().any(|i| i.code == JMP_JA));
        for nr in 0..6002u32 {
            let i = ((nr / 2) as usize).min(ranges.len() - 1);
            let expected = match leaves[i % 4] {
                Leaf::Ret(a) => a,
                Leaf::Socket => RET_NOTIFY, // domain 0
                Leaf::Ioctl => RET_ALLOW,   // request 0
                _ => unreachable!(),
            };
            assert_eq!(
                run(&prog, &data(AUDIT_ARCH_NATIVE, i64::from(nr), NONE)).0,
                expected,
                "nr {nr}"
            );
        }
    }

    #[test]
    fn kernel_structure_sizes() {
        let mut sizes = libc::seccomp_notif_sizes {
            seccomp_notif: 0,
            seccomp_notif_resp: 0,
            seccomp_data: 0,
        };
        // SAFETY: GET_NOTIF_SIZES writes one seccomp_notif_sizes.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_GET_NOTIF_SIZES,
                0,
                &mut sizes as *mut _,
            )
        };
        assert_eq!(ret, 0, "{}", io::Error::last_os_error());
        assert_eq!(
            usize::from(sizes.seccomp_notif),
            size_of::<libc::seccomp_notif>()
        );
        assert_eq!(
            usize::from(sizes.seccomp_notif_resp),
            size_of::<libc::seccomp_notif_resp>()
        );
        assert_eq!(
            usize::from(sizes.seccomp_data),
            size_of::<libc::seccomp_data>()
        );
        assert_eq!(OFF_NR, 0);
        assert_eq!(OFF_ARCH, 4);
        assert_eq!(arg_low(0), 16);
        assert_eq!(arg_low(5), 56);
        // SAFETY: arithmetic only.
        assert_eq!(
            size_of::<OneFdCmsg>(),
            unsafe { libc::CMSG_SPACE(size_of::<c_int>() as u32) } as usize
        );
    }

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

    #[test]
    fn fd_passing_round_trip() {
        let (a, b) = socketpair();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        // SAFETY: both fds are open for the duration of the call.
        assert_eq!(unsafe { send_fd(a.as_raw_fd(), file.as_raw_fd()) }, 1);
        let got = recv_fd(b.as_fd()).unwrap();
        assert_ne!(got.as_raw_fd(), file.as_raw_fd());
        // SAFETY: F_GETFD on an owned fd.
        let flags = unsafe { libc::fcntl(got.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let same = |f: &dyn AsRawFd| {
            // SAFETY: all-zero stat is valid; fstat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid fd and buffer.
            assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), &mut st) }, 0);
            (st.st_dev, st.st_ino)
        };
        assert_eq!(same(&got), same(&file));

        // Data without an fd, then EOF.
        // SAFETY: writing one byte from a live buffer.
        assert_eq!(
            unsafe { libc::write(a.as_raw_fd(), b"x".as_ptr().cast(), 1) },
            1
        );
        assert_eq!(
            recv_fd(b.as_fd()).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        drop(a);
        assert_eq!(
            recv_fd(b.as_fd()).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn nothing_pending_is_none() {
        // A non-listener fd that is not readable: answer_notification must not block.
        let (a, _b) = socketpair();
        assert!(answer_notification(a.as_fd()).unwrap().is_none());
    }

    // -----------------------------------------------------------------------------------------
    // Live tests: a forked child installs the filter and the test answers its notifications.
    // -----------------------------------------------------------------------------------------

    fn raw_exit(code: i32) -> ! {
        // SAFETY: exit_group takes no pointers and does not return.
        unsafe { sys::syscall3(libc::SYS_exit_group, code as usize, 0, 0) };
        unreachable!()
    }

    fn errno_of(ret: isize) -> i32 {
        if ret < 0 {
            (-ret) as i32
        } else {
            0
        }
    }

    struct Outcome {
        status: c_int,
        denials: Vec<Denial>,
    }

    impl Outcome {
        fn exit_code(&self) -> i32 {
            assert!(
                libc::WIFEXITED(self.status),
                "child did not exit: status {:#x}",
                self.status
            );
            libc::WEXITSTATUS(self.status)
        }
    }

    /// Forks; the child sets no_new_privs, installs the filter, sends the listener, closes it and
    /// exits with `body()`, which must use raw system calls only (the test harness is
    /// multi-threaded). The parent answers notifications until the child exits.
    fn sandboxed(policy: Policy, body: impl FnOnce() -> i32) -> Outcome {
        let filter = Filter::compile(&policy);
        let (parent_sock, child_sock) = socketpair();
        // SAFETY: the child only makes raw system calls before exiting or exec'ing.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain prctl with integer arguments.
            let ret = unsafe {
                sys::syscall5(
                    libc::SYS_prctl,
                    libc::PR_SET_NO_NEW_PRIVS as usize,
                    1,
                    0,
                    0,
                    0,
                )
            };
            if ret != 0 {
                raw_exit(200);
            }
            // SAFETY: single-threaded child with no_new_privs set.
            let listener = match unsafe { filter.install() } {
                Ok(fd) => fd,
                Err(_) => raw_exit(201),
            };
            // The listener is close-on-exec.
            let flags = raw(
                libc::SYS_fcntl,
                [listener as usize, libc::F_GETFD as usize, 0, 0, 0, 0],
            );
            if flags < 0 || flags & libc::FD_CLOEXEC as isize == 0 {
                raw_exit(203);
            }
            // SAFETY: both fds are open in this process.
            if unsafe { send_fd(child_sock.as_raw_fd(), listener) } != 1 {
                raw_exit(202);
            }
            // SAFETY: closing fds this process owns; the box must not keep its listener.
            unsafe {
                sys::syscall3(libc::SYS_close, listener as usize, 0, 0);
                sys::syscall3(libc::SYS_close, child_sock.as_raw_fd() as usize, 0, 0);
            }
            raw_exit(body());
        }
        drop(child_sock);
        let listener = recv_fd(parent_sock.as_fd()).unwrap_or_else(|e| {
            let mut status = 0;
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("no listener ({e}); child status {status:#x}");
        });
        supervise(pid, listener.as_fd())
    }

    fn supervise(pid: libc::pid_t, listener: BorrowedFd<'_>) -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut denials = Vec::new();
        loop {
            let mut pfd = libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 5) };
            while let Some(d) = answer_notification(listener).unwrap() {
                denials.push(d);
            }
            let mut status = 0;
            // SAFETY: polling our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                while let Some(d) = answer_notification(listener).unwrap() {
                    denials.push(d);
                }
                return Outcome { status, denials };
            }
            assert_eq!(r, 0, "waitpid: {}", io::Error::last_os_error());
            if Instant::now() > deadline {
                // SAFETY: killing and reaping our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                panic!("child timed out; denials so far: {denials:?}");
            }
        }
    }

    /// Raw system call in the sandboxed child.
    fn raw(nr: c_long, a: [usize; 6]) -> isize {
        // SAFETY: the callers pass only integers or pointers to live locals.
        unsafe { sys::syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
    }

    struct Case {
        what: &'static str,
        policy: Policy,
        body: fn() -> i32,
        errno: i32,
        denied: Option<&'static str>,
    }

    #[test]
    fn live_raw_system_calls() {
        let cases = [
            Case {
                what: "ptrace (allowed)",
                policy: DEFAULT,
                body: || {
                    errno_of(raw(
                        libc::SYS_ptrace,
                        [libc::PTRACE_TRACEME as usize, 0, 0, 0, 0, 0],
                    ))
                },
                errno: 0,
                denied: None,
            },
            Case {
                what: "unshare",
                policy: DEFAULT,
                body: || {
                    errno_of(raw(
                        libc::SYS_unshare,
                        [libc::CLONE_NEWUSER as usize, 0, 0, 0, 0, 0],
                    ))
                },
                errno: libc::EPERM,
                denied: Some("unshare"),
            },
            Case {
                what: "mount",
                policy: DEFAULT,
                body: || {
                    let src = b"none\0";
                    let dst = b"/tmp\0";
                    let fs = b"tmpfs\0";
                    errno_of(raw(
                        libc::SYS_mount,
                        [
                            src.as_ptr() as usize,
                            dst.as_ptr() as usize,
                            fs.as_ptr() as usize,
                            0,
                            0,
                            0,
                        ],
                    ))
                },
                errno: libc::EPERM,
                denied: Some("mount"),
            },
            Case {
                what: "bpf",
                policy: DEFAULT,
                body: || errno_of(raw(libc::SYS_bpf, [0; 6])),
                errno: libc::EPERM,
                denied: Some("bpf"),
            },
            Case {
                what: "keyctl",
                policy: DEFAULT,
                body: || errno_of(raw(libc::SYS_keyctl, [0; 6])),
                errno: libc::EPERM,
                denied: Some("keyctl"),
            },
            Case {
                what: "socket(AF_INET) without network (the private namespace)",
                policy: DEFAULT,
                body: || {
                    errno_of(raw(
                        libc::SYS_socket,
                        [
                            libc::AF_INET as usize,
                            libc::SOCK_STREAM as usize,
                            0,
                            0,
                            0,
                            0,
                        ],
                    ))
                },
                errno: 0,
                denied: None,
            },
            Case {
                what: "socket(AF_NETLINK, NETLINK_ROUTE) without network",
                policy: DEFAULT,
                body: || {
                    errno_of(raw(
                        libc::SYS_socket,
                        [
                            libc::AF_NETLINK as usize,
                            libc::SOCK_RAW as usize,
                            libc::NETLINK_ROUTE as usize,
                            0,
                            0,
                            0,
                        ],
                    ))
                },
                errno: 0,
                denied: None,
            },
            Case {
                what: "socket(AF_NETLINK, NETLINK_NETFILTER) without network",
                policy: DEFAULT,
                body: || {
                    errno_of(raw(
                        libc::SYS_socket,
                        [
                            libc::AF_NETLINK as usize,
                            libc::SOCK_RAW as usize,
                            libc::NETLINK_NETFILTER as usize,
                            0,
                            0,
                            0,
                        ],
                    ))
                },
                errno: libc::EPROTONOSUPPORT,
                denied: Some("socket"),
            },
            Case {
                what: "socket(AF_NETLINK, NETLINK_AUDIT) without network (plain)",
                policy: DEFAULT,
                body: || {
                    errno_of(raw(
                        libc::SYS_socket,
                        [
                            libc::AF_NETLINK as usize,
                            libc::SOCK_RAW as usize,
                            libc::NETLINK_AUDIT as usize,
                            0,
                            0,
                            0,
                        ],
                    ))
                },
                errno: libc::EPROTONOSUPPORT,
                denied: None,
            },
            Case {
                what: "socket(AF_INET) with network",
                policy: NETWORK,
                body: || {
                    errno_of(raw(
                        libc::SYS_socket,
                        [
                            libc::AF_INET as usize,
                            libc::SOCK_STREAM as usize,
                            0,
                            0,
                            0,
                            0,
                        ],
                    ))
                },
                errno: 0,
                denied: None,
            },
            Case {
                what: "socket(AF_PACKET) with network",
                policy: NETWORK,
                body: || {
                    errno_of(raw(
                        libc::SYS_socket,
                        [
                            libc::AF_PACKET as usize,
                            libc::SOCK_RAW as usize,
                            0,
                            0,
                            0,
                            0,
                        ],
                    ))
                },
                errno: libc::EAFNOSUPPORT,
                denied: Some("socket"),
            },
            Case {
                what: "socketpair(AF_UNIX)",
                policy: DEFAULT,
                body: || {
                    let mut sv = [0 as c_int; 2];
                    errno_of(raw(
                        libc::SYS_socketpair,
                        [
                            libc::AF_UNIX as usize,
                            libc::SOCK_STREAM as usize,
                            0,
                            sv.as_mut_ptr() as usize,
                            0,
                            0,
                        ],
                    ))
                },
                errno: 0,
                denied: None,
            },
            Case {
                what: "ioctl(TIOCSTI)",
                policy: DEFAULT,
                body: || {
                    let c = b'x';
                    errno_of(raw(
                        libc::SYS_ioctl,
                        [0, libc::TIOCSTI as usize, &c as *const u8 as usize, 0, 0, 0],
                    ))
                },
                errno: libc::EPERM,
                denied: Some("ioctl"),
            },
            Case {
                what: "ioctl(TCGETS) on a bad fd",
                policy: DEFAULT,
                body: || {
                    errno_of(raw(
                        libc::SYS_ioctl,
                        [9999, libc::TCGETS as usize, 0, 0, 0, 0],
                    ))
                },
                errno: libc::EBADF,
                denied: None,
            },
            Case {
                what: "clone(CLONE_NEWUSER)",
                policy: DEFAULT,
                body: || {
                    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as usize;
                    match raw(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]) {
                        0 => raw_exit(0), // in a grandchild: the filter let it through
                        r if r > 0 => 99,
                        r => errno_of(r),
                    }
                },
                errno: libc::EPERM,
                denied: Some("clone"),
            },
            Case {
                what: "clone3",
                policy: DEFAULT,
                body: || errno_of(raw(libc::SYS_clone3, [0, 0, 0, 0, 0, 0])),
                errno: libc::ENOSYS,
                denied: None,
            },
            Case {
                what: "personality(PER_LINUX32)",
                policy: DEFAULT,
                body: || errno_of(raw(libc::SYS_personality, [8, 0, 0, 0, 0, 0])),
                errno: libc::EPERM,
                denied: Some("personality"),
            },
            Case {
                what: "personality query",
                policy: DEFAULT,
                body: || errno_of(raw(libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0])),
                errno: 0,
                denied: None,
            },
            Case {
                what: "unknown number",
                policy: DEFAULT,
                body: || errno_of(raw(1000, [0; 6])),
                errno: libc::ENOSYS,
                denied: Some("syscall_1000"),
            },
            Case {
                what: "memfd_secret (known, unlisted)",
                policy: DEFAULT,
                body: || errno_of(raw(libc::SYS_memfd_secret, [0; 6])),
                errno: libc::ENOSYS,
                denied: Some("memfd_secret"),
            },
            Case {
                what: "statmount (plain ENOSYS, unreported)",
                policy: DEFAULT,
                body: || errno_of(raw(nr::SYS_statmount, [0; 6])),
                errno: libc::ENOSYS,
                denied: None,
            },
            Case {
                what: "syslog (plain EPERM, unreported)",
                policy: DEFAULT,
                body: || errno_of(raw(libc::SYS_syslog, [3, 0, 0, 0, 0, 0])),
                errno: libc::EPERM,
                denied: None,
            },
        ];
        for case in &cases {
            let out = sandboxed(case.policy, case.body);
            assert_eq!(
                out.exit_code(),
                case.errno,
                "{}: errno (denials {:?})",
                case.what,
                out.denials
            );
            match case.denied {
                None => assert!(out.denials.is_empty(), "{}: {:?}", case.what, out.denials),
                Some(name) => {
                    assert_eq!(out.denials.len(), 1, "{}: {:?}", case.what, out.denials);
                    let d = &out.denials[0];
                    assert_eq!(d.name, name, "{}", case.what);
                    assert_eq!(d.errno, case.errno, "{}", case.what);
                }
            }
        }
    }

    #[test]
    fn closed_listener_fails_calls_with_enosys() {
        let filter = Filter::compile(&DEFAULT);
        // SAFETY: the child only makes raw system calls.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            if raw(
                libc::SYS_prctl,
                [libc::PR_SET_NO_NEW_PRIVS as usize, 1, 0, 0, 0, 0],
            ) != 0
            {
                raw_exit(200);
            }
            // SAFETY: single-threaded child with no_new_privs set.
            let Ok(listener) = (unsafe { filter.install() }) else {
                raw_exit(201)
            };
            raw(libc::SYS_close, [listener as usize, 0, 0, 0, 0, 0]);
            raw_exit(errno_of(raw(libc::SYS_bpf, [0; 6])));
        }
        let mut status = 0;
        // SAFETY: reaping our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), libc::ENOSYS);
    }

    #[test]
    fn live_denial_carries_arguments() {
        let out = sandboxed(DEFAULT, || {
            errno_of(raw(
                libc::SYS_socket,
                [
                    libc::AF_PACKET as usize,
                    libc::SOCK_DGRAM as usize,
                    17,
                    0,
                    0,
                    0,
                ],
            ))
        });
        assert_eq!(out.exit_code(), libc::EAFNOSUPPORT);
        assert_eq!(
            out.denials,
            vec![Denial {
                nr: libc::SYS_socket,
                name: "socket".into(),
                args: [libc::AF_PACKET as u64, libc::SOCK_DGRAM as u64, 17, 0, 0, 0],
                errno: libc::EAFNOSUPPORT,
            }]
        );
    }

    /// An `execve` prepared in the parent, so the child only makes the raw call.
    struct Exec {
        path: CString,
        _strings: Vec<CString>,
        argv: Vec<*const libc::c_char>,
        envp: Vec<*const libc::c_char>,
    }

    impl Exec {
        fn new(path: &str, args: &[&str]) -> Exec {
            let path = CString::new(path).unwrap();
            let mut strings: Vec<CString> =
                args.iter().map(|a| CString::new(*a).unwrap()).collect();
            let argc = strings.len();
            strings
                .extend(std::env::vars().map(|(k, v)| CString::new(format!("{k}={v}")).unwrap()));
            let mut argv: Vec<_> = strings[..argc].iter().map(|s| s.as_ptr()).collect();
            argv.push(std::ptr::null());
            let mut envp: Vec<_> = strings[argc..].iter().map(|s| s.as_ptr()).collect();
            envp.push(std::ptr::null());
            Exec {
                path,
                _strings: strings,
                argv,
                envp,
            }
        }

        fn run(&self, policy: Policy) -> Outcome {
            sandboxed(policy, || {
                let ret = raw(
                    libc::SYS_execve,
                    [
                        self.path.as_ptr() as usize,
                        self.argv.as_ptr() as usize,
                        self.envp.as_ptr() as usize,
                        0,
                        0,
                        0,
                    ],
                );
                125 + errno_of(ret).min(1)
            })
        }
    }

    fn on_path(program: &str) -> String {
        let path = std::env::var("PATH").unwrap_or_default();
        for dir in path.split(':').filter(|d| !d.is_empty()) {
            let candidate = format!("{dir}/{program}");
            if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
                return candidate;
            }
        }
        panic!("{program} not on PATH");
    }

    #[test]
    fn live_bin_true() {
        let out = Exec::new("/bin/true", &["true"]).run(DEFAULT);
        assert_eq!(out.exit_code(), 0);
        assert!(out.denials.is_empty(), "{:?}", out.denials);
    }

    #[test]
    fn live_shell_and_coreutils() {
        let script = "set -e; d=$(mktemp -d); echo hello > $d/f; cp $d/f $d/g; mv $d/g $d/h; \
                      chmod 600 $d/h; ln -s $d/h $d/l; ls -la $d > /dev/null; cat $d/l | sort | uniq | wc -l > /dev/null; \
                      ( sleep 0.01 & wait ); date > /dev/null; id > /dev/null; stat $d/h > /dev/null; \
                      printf '%s\\n' a b | head -1 | grep -q a; rm -r $d; exit 7";
        let out = Exec::new("/bin/sh", &["sh", "-c", script]).run(DEFAULT);
        assert!(out.denials.is_empty(), "{:?}", out.denials);
        assert_eq!(out.exit_code(), 7);
    }

    const PYTHON: &str = r#"
import threading, subprocess, json, socket, asyncio, os, select, time, mmap
import multiprocessing as mp

t = threading.Thread(target=time.sleep, args=(0.01,)); t.start(); t.join()
assert subprocess.run(["/bin/sh", "-c", "exit 3"]).returncode == 3
assert subprocess.run(["true"]).returncode == 0
a, b = socket.socketpair(); a.sendall(b"x"); assert b.recv(1) == b"x"
u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); u.close()
async def main():
    p = await asyncio.create_subprocess_exec("true"); assert await p.wait() == 0
    await asyncio.sleep(0.01)
asyncio.run(main())
with mp.get_context("fork").Pool(2) as pool:
    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
select.select([], [], [], 0); ep = select.epoll(); ep.close(); select.poll().poll(0)
m = mmap.mmap(-1, 1 << 20); m[0] = 1; m.close()
os.sched_getaffinity(0); os.cpu_count(); os.urandom(8); os.getloadavg()
json.dumps({"ok": True})
try:
    import numpy as np
    assert float(np.ones((64, 64)).dot(np.ones((64, 64)))[0, 0]) == 64.0
except ImportError:
    pass
raise SystemExit(42)  # proves the script ran to the end
"#;

    #[test]
    fn live_python() {
        let python = on_path("python3");
        let out = Exec::new(&python, &["python3", "-c", PYTHON]).run(DEFAULT);
        assert!(out.denials.is_empty(), "{:?}", out.denials);
        assert_eq!(out.exit_code(), 42);
    }
}

/// The policy in words, for other enforcers (the nsjail backend compiles it to Kafel).
#[derive(Debug, Clone, Default)]
pub struct PolicyDescription {
    /// Allowed whatever the arguments.
    pub allow: Vec<&'static str>,
    /// Refused with `EPERM`.
    pub deny: Vec<&'static str>,
    /// Refused with `ENOSYS` without a report (`clone3`, and the `ENOSYS` ones of
    /// `ERRNO_PLAIN`).
    pub enosys: Vec<&'static str>,
    /// Refused without a report with another errno (`syslog`: `EPERM`).
    pub errno: Vec<(&'static str, i32)>,
    /// `clone` flags that are refused (`EPERM`).
    pub clone_refused_flags: u32,
    /// `socket`/`socketpair` domains that are allowed (others: `EAFNOSUPPORT`).
    pub socket_domains: Vec<u32>,
    /// `None`: `AF_NETLINK` is in `socket_domains` (any protocol). Otherwise the `AF_NETLINK`
    /// protocols (arg2) that are allowed; others get `EPROTONOSUPPORT`.
    pub netlink_protocols: Option<Vec<u32>>,
    /// `AF_NETLINK` protocols refused with `EPROTONOSUPPORT` without a report.
    pub plain_netlink_protocols: Vec<u32>,
    /// `ioctl` requests that are refused (`EPERM`).
    pub refused_ioctls: Vec<u32>,
    /// `personality` values that are allowed (others: `EPERM`).
    pub personalities: Vec<u32>,
    /// Resources whose limit `setrlimit`/`prlimit64` may not change (see [`PINNED_RLIMIT`]);
    /// the calls are allowed otherwise.
    pub pinned_rlimits: Vec<u32>,
}

/// Describes the policy [`Filter::compile`] enforces.
pub fn describe(policy: &Policy) -> PolicyDescription {
    let name = |nr: u32| syscall_name(nr as i64);
    let mut d = PolicyDescription {
        clone_refused_flags: CLONE_NAMESPACE_FLAGS,
        refused_ioctls: REFUSED_IOCTLS.to_vec(),
        personalities: ALLOWED_PERSONAS.to_vec(),
        pinned_rlimits: vec![PINNED_RLIMIT],
        ..Default::default()
    };
    if policy.allow_network {
        d.socket_domains = NETWORK_DOMAINS.to_vec();
    } else {
        d.socket_domains = LOCAL_DOMAINS.to_vec();
        d.netlink_protocols = Some(LOCAL_NETLINK_PROTOCOLS.to_vec());
        d.plain_netlink_protocols = PLAIN_NETLINK_PROTOCOLS.to_vec();
    }
    for (nr, leaf) in rules() {
        let Some(n) = name(nr) else { continue };
        match leaf {
            Leaf::Ret(RET_ALLOW) => d.allow.push(n),
            Leaf::Ret(RET_NOTIFY) => d.deny.push(n),
            Leaf::Ret(RET_ENOSYS) => d.enosys.push(n),
            Leaf::Ret(action) => d.errno.push((n, (action & libc::SECCOMP_RET_DATA) as i32)),
            _ => {}
        }
    }
    d
}
