//! The policy: which system calls a box may make, which it may make after an argument check,
//! and which are refused with which errno (see `docs/design/seccomp.md`).

use libc::c_long;

use super::tables::nr;

/// What a box may do beyond the fixed part of the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// The box shares the host's network: allow `AF_NETLINK` sockets of any protocol. (`AF_UNIX`,
    /// `AF_INET`, `AF_INET6` and the read-only netlink protocols are always allowed: without
    /// this, the box's network namespace is private.)
    pub allow_network: bool,
}

// ---------------------------------------------------------------------------------------------
// Policy tables
// ---------------------------------------------------------------------------------------------

/// Allowed without argument checks on every supported architecture.
pub(super) const ALLOW_COMMON: &[c_long] = &[
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
    // Tracing, confined to the box: see docs/design/seccomp.md. `process_vm_*` take the same
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
pub(super) const ALLOW_ARCH: &[c_long] = &[
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
pub(super) const ALLOW_ARCH: &[c_long] = &[
    nr::SYS_renameat,
    nr::SYS_fchmodat2,
    nr::SYS_sync_file_range,
    nr::SYS_getrlimit,
    nr::SYS_io_pgetevents,
];

/// Refused with `EPERM` on every supported architecture: privileged, host-global, or large
/// kernel attack surface that no ordinary program needs.
pub(super) const DENY_COMMON: &[c_long] = &[
    // Reaching into other processes beyond what `ptrace` gives (which is allowed: see
    // docs/design/seccomp.md).
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
pub(super) const DENY_ARCH: &[c_long] = &[
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_modify_ldt,
    libc::SYS_uselib,
];

/// Refused with `EPERM`, aarch64 only.
#[cfg(target_arch = "aarch64")]
pub(super) const DENY_ARCH: &[c_long] = &[];

/// Refused with a plain `SECCOMP_RET_ERRNO`, unreported (not in the verdict's
/// `denied_syscalls`), with the errno the kernel itself gives an unprivileged caller or a
/// kernel without the call: refusals that ordinary programs meet routinely and handle. See
/// `docs/design/seccomp.md` for the classification.
pub(super) const ERRNO_PLAIN: &[(c_long, i32)] = &[
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
pub(super) const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u32;

/// Socket domains allowed without [`Policy::allow_network`]: the box's network namespace is
/// private (only `lo`), so IP sockets reach nothing but the box itself.
pub(super) const LOCAL_DOMAINS: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
];

/// `AF_NETLINK` protocols allowed without [`Policy::allow_network`]: `NETLINK_ROUTE` only
/// (interfaces, addresses and routes of the private namespace; changing them needs
/// `CAP_NET_ADMIN` over it, which the box lacks).
pub(super) const LOCAL_NETLINK_PROTOCOLS: &[u32] = &[
    libc::NETLINK_ROUTE as u32,
    // `ss`: the sockets of the private namespace, as /proc/net/{tcp,udp,unix} show them
    // (destroying one needs CAP_NET_ADMIN).
    libc::NETLINK_SOCK_DIAG as u32,
];

/// `AF_NETLINK` protocols refused with a plain `EPROTONOSUPPORT` (unreported) without
/// [`Policy::allow_network`]: `NETLINK_AUDIT`, which PAM, `su`, `login` and `crond` open to log
/// and which the kernel refuses that way when built without audit. Every other protocol is
/// notified (and answered `EPROTONOSUPPORT`).
pub(super) const PLAIN_NETLINK_PROTOCOLS: &[u32] = &[libc::NETLINK_AUDIT as u32];

/// Socket domains allowed with [`Policy::allow_network`].
pub(super) const NETWORK_DOMAINS: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
    libc::AF_NETLINK as u32,
];

/// Terminal ioctls that inject input or drive the console.
pub(super) const REFUSED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// `personality` arguments allowed: a query (`0xffffffff`), `PER_LINUX` (`0`), and
/// `PER_LINUX | ADDR_NO_RANDOMIZE`, which gdb (and `setarch -R`) set for the programs they
/// start: address-space randomisation only guards a process against exploits of its own bugs,
/// and every process of the box is the box's own.
pub(super) const ALLOWED_PERSONAS: &[u32] = &[0, 0xffff_ffff, ADDR_NO_RANDOMIZE];

/// `ADDR_NO_RANDOMIZE` of `<linux/personality.h>`.
pub(super) const ADDR_NO_RANDOMIZE: u32 = 0x0040000;

/// The errno the supervisor answers a notification for system call `nr` with arguments
/// `args` with.
pub(super) fn denial_errno(nr: c_long, args: &[u64; 6]) -> i32 {
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
