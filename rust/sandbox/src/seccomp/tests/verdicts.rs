//! The compiled program's verdicts, checked on a classic-BPF interpreter.

use super::*;

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
