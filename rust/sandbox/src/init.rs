//! The box's init: a 135-byte (x86_64) / 152-byte (aarch64) static program, written into every
//! box root as `/.agentrl/init`.
//!
//! The program a box runs must not be pid 1 of its pid namespace: the kernel drops the
//! signals an init sends itself without a handler (`kill(getpid(), SIGTERM)`, `abort()`,
//! `SIGXFSZ` past the file-size limit would all be lost), and orphans would pile up as its
//! zombies. So the box's first process starts the program as pid 2 and then becomes this
//! init, which only reaps: it loops on `wait4(-1, &status, __WALL)`, and when pid 2 exits it
//! writes pid 2's raw wait status (4 bytes) to fd 3 (the supervisor's status pipe) and exits,
//! taking the rest of the namespace with it. It runs as its own unprivileged host uid, with
//! no capabilities and `no_new_privs`, so the program can neither signal, trace nor read it.
//!
//! # Tracing
//!
//! The init has no seccomp filter (it is exec'd by pid 1 before any filter exists), and the
//! box may use `ptrace` (see [`crate::seccomp`]), so the init must be out of a tracer's
//! reach: besides running as another uid, its first act is `prctl(PR_SET_DUMPABLE, 0)`, so
//! `PTRACE_ATTACH`, `process_vm_readv` and `/proc/1/mem` fail even for a process that shared
//! its uid. The other direction is possible: the program may make the init its tracer with
//! `PTRACE_TRACEME` (anti-debugging checks do), and the init's `wait4` then reports the
//! program's *stops*. The init is no debugger: on a stop of pid 2 it detaches
//! (`PTRACE_DETACH`, handing the signal back so it is delivered as if untraced; the
//! `SIGTRAP` of an `execve` under `PTRACE_TRACEME` is dropped, as it is the tracer's) and
//! goes on waiting, so a stop is never reported as the program's exit.
//!
//! The machine code was assembled from the listing beside each array (GNU as for x86_64,
//! `llvm-mc -triple=aarch64` for aarch64), and is wrapped in a minimal ELF64 executable (one
//! `PT_LOAD` segment, no sections) by [`elf`].
//!
//! A warm run has a second, even smaller init, [`idle_elf`] at [`IDLE_PATH`]: there the
//! program (pid 2) is a fork of the warm interpreter, so it is the interpreter that reaps it
//! and reports its wait status. That init only makes itself non-dumpable and waits, with
//! `SIGCHLD` ignored (set before its `execve`, which keeps ignored signals ignored) so that
//! the kernel reaps every orphan handed to it; it ends when the interpreter kills it after
//! the program, and the kernel takes the rest of the namespace with it.

/// x86_64: see the listing.
///
/// ```text
/// _start: mov eax, 157            ; prctl(PR_SET_DUMPABLE, 0)
///         mov edi, 4
///         xor esi, esi
///         syscall
///         sub rsp, 16
/// 1:      mov eax, 61             ; wait4
///         mov rdi, -1             ; any child
///         mov rsi, rsp            ; &status
///         mov edx, 0x40000000     ; __WALL
///         xor r10d, r10d          ; no rusage
///         syscall
///         cmp rax, 2              ; the program?
///         je 3f
///         cmp rax, -4             ; EINTR
///         je 1b
///         test rax, rax           ; another child reaped
///         jns 1b
///         jmp 4f                  ; no child left
/// 3:      cmp byte ptr [rsp], 0x7f ; stopped (it made us its tracer)?
///         jne 5f
///         movzx r10d, byte ptr [rsp+1] ; the stop signal
///         cmp r10d, 5             ; SIGTRAP: dropped
///         jne 6f
///         xor r10d, r10d
/// 6:      mov eax, 101            ; ptrace(PTRACE_DETACH, 2, 0, signal)
///         mov edi, 17
///         mov esi, 2
///         xor edx, edx
///         syscall
///         jmp 1b
/// 5:      mov eax, 1              ; write(3, &status, 4)
///         mov edi, 3
///         mov rsi, rsp
///         mov edx, 4
///         syscall
/// 4:      mov eax, 231            ; exit_group(0)
///         xor edi, edi
///         syscall
///         jmp 4b
/// ```
#[cfg(target_arch = "x86_64")]
const CODE: &[u8] = &[
    0xb8, 0x9d, 0x00, 0x00, 0x00, 0xbf, 0x04, 0x00, 0x00, 0x00, 0x31, 0xf6, 0x0f, 0x05, 0x48, 0x83,
    0xec, 0x10, 0xb8, 0x3d, 0x00, 0x00, 0x00, 0x48, 0xc7, 0xc7, 0xff, 0xff, 0xff, 0xff, 0x48, 0x89,
    0xe6, 0xba, 0x00, 0x00, 0x00, 0x40, 0x45, 0x31, 0xd2, 0x0f, 0x05, 0x48, 0x83, 0xf8, 0x02, 0x74,
    0x0d, 0x48, 0x83, 0xf8, 0xfc, 0x74, 0xdb, 0x48, 0x85, 0xc0, 0x79, 0xd6, 0xeb, 0x3e, 0x80, 0x3c,
    0x24, 0x7f, 0x75, 0x24, 0x44, 0x0f, 0xb6, 0x54, 0x24, 0x01, 0x41, 0x83, 0xfa, 0x05, 0x75, 0x03,
    0x45, 0x31, 0xd2, 0xb8, 0x65, 0x00, 0x00, 0x00, 0xbf, 0x11, 0x00, 0x00, 0x00, 0xbe, 0x02, 0x00,
    0x00, 0x00, 0x31, 0xd2, 0x0f, 0x05, 0xeb, 0xaa, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xbf, 0x03, 0x00,
    0x00, 0x00, 0x48, 0x89, 0xe6, 0xba, 0x04, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xb8, 0xe7, 0x00, 0x00,
    0x00, 0x31, 0xff, 0x0f, 0x05, 0xeb, 0xf5,
];
#[cfg(target_arch = "x86_64")]
const MACHINE: u16 = 62;

/// aarch64: the same program.
///
/// ```text
/// _start: mov x8, #167            ; prctl(PR_SET_DUMPABLE, 0)
///         mov x0, #4
///         mov x1, #0
///         svc #0
///         sub sp, sp, #16
/// 1:      mov x8, #260            ; wait4
///         mov x0, #-1
///         mov x1, sp
///         mov x2, #0x40000000     ; __WALL
///         mov x3, #0
///         svc #0
///         cmp x0, #2
///         b.eq 3f
///         cmn x0, #4              ; EINTR
///         b.eq 1b
///         tbz x0, #63, 1b         ; another child reaped
///         b 4f
/// 3:      ldrb w9, [sp]           ; stopped (it made us its tracer)?
///         cmp w9, #0x7f
///         b.ne 5f
///         ldrb w3, [sp, #1]       ; the stop signal
///         cmp w3, #5              ; SIGTRAP: dropped
///         csel x3, xzr, x3, eq
///         mov x8, #117            ; ptrace(PTRACE_DETACH, 2, 0, signal)
///         mov x0, #17
///         mov x1, #2
///         mov x2, #0
///         svc #0
///         b 1b
/// 5:      mov x8, #64             ; write(3, sp, 4)
///         mov x0, #3
///         mov x1, sp
///         mov x2, #4
///         svc #0
/// 4:      mov x8, #94             ; exit_group(0)
///         mov x0, #0
///         svc #0
///         b 4b
/// ```
#[cfg(target_arch = "aarch64")]
const CODE: &[u8] = &[
    0xe8, 0x14, 0x80, 0xd2, 0x80, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4,
    0xff, 0x43, 0x00, 0xd1, 0x88, 0x20, 0x80, 0xd2, 0x00, 0x00, 0x80, 0x92, 0xe1, 0x03, 0x00, 0x91,
    0x02, 0x00, 0xa8, 0xd2, 0x03, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4, 0x1f, 0x08, 0x00, 0xf1,
    0xa0, 0x00, 0x00, 0x54, 0x1f, 0x10, 0x00, 0xb1, 0xe0, 0xfe, 0xff, 0x54, 0xc0, 0xfe, 0xff, 0xb6,
    0x12, 0x00, 0x00, 0x14, 0xe9, 0x03, 0x40, 0x39, 0x3f, 0xfd, 0x01, 0x71, 0x41, 0x01, 0x00, 0x54,
    0xe3, 0x07, 0x40, 0x39, 0x7f, 0x14, 0x00, 0x71, 0xe3, 0x03, 0x83, 0x9a, 0xa8, 0x0e, 0x80, 0xd2,
    0x20, 0x02, 0x80, 0xd2, 0x41, 0x00, 0x80, 0xd2, 0x02, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4,
    0xe9, 0xff, 0xff, 0x17, 0x08, 0x08, 0x80, 0xd2, 0x60, 0x00, 0x80, 0xd2, 0xe1, 0x03, 0x00, 0x91,
    0x82, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4, 0xc8, 0x0b, 0x80, 0xd2, 0x00, 0x00, 0x80, 0xd2,
    0x01, 0x00, 0x00, 0xd4, 0xfd, 0xff, 0xff, 0x17,
];
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = 183;

/// x86_64: the idle init.
///
/// ```text
/// _start: mov eax, 157            ; prctl(PR_SET_DUMPABLE, 0)
///         mov edi, 4
///         xor esi, esi
///         syscall
/// 1:      mov eax, 34             ; pause
///         syscall
///         jmp 1b
/// ```
#[cfg(target_arch = "x86_64")]
const IDLE_CODE: &[u8] = &[
    0xb8, 0x9d, 0x00, 0x00, 0x00, 0xbf, 0x04, 0x00, 0x00, 0x00, 0x31, 0xf6, 0x0f, 0x05, 0xb8, 0x22,
    0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xf7,
];

/// aarch64: the idle init (no `pause` there: `ppoll` with no fds, no timeout, same mask).
///
/// ```text
/// _start: mov x8, #167            ; prctl(PR_SET_DUMPABLE, 0)
///         mov x0, #4
///         mov x1, #0
///         svc #0
/// 1:      mov x8, #73             ; ppoll
///         mov x0, #0
///         mov x1, #0
///         mov x2, #0
///         mov x3, #0
///         svc #0
///         b 1b
/// ```
#[cfg(target_arch = "aarch64")]
const IDLE_CODE: &[u8] = &[
    0xe8, 0x14, 0x80, 0xd2, 0x80, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4,
    0x28, 0x09, 0x80, 0xd2, 0x00, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x80, 0xd2, 0x02, 0x00, 0x80, 0xd2,
    0x03, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4, 0xfa, 0xff, 0xff, 0x17,
];

/// Where the init lives in the box.
pub const PATH: &str = "/.agentrl/init";

/// Where the idle init of warm runs lives in the box.
pub const IDLE_PATH: &str = "/.agentrl/idle";

const BASE: u64 = 0x40_0000;
const EHDR: usize = 64;
const PHDR: usize = 56;

/// The init as a static ELF64 executable.
pub fn elf() -> Vec<u8> {
    wrap(CODE)
}

/// The idle init of warm runs as a static ELF64 executable.
pub fn idle_elf() -> Vec<u8> {
    wrap(IDLE_CODE)
}

/// Wraps machine code in a minimal ELF64 executable whose entry point is its first byte.
fn wrap(code: &[u8]) -> Vec<u8> {
    let total = (EHDR + PHDR + code.len()) as u64;
    let mut v = Vec::with_capacity(total as usize);
    // ELF header.
    v.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    v.extend_from_slice(&[0; 8]);
    v.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    v.extend_from_slice(&MACHINE.to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    v.extend_from_slice(&(BASE + (EHDR + PHDR) as u64).to_le_bytes()); // e_entry
    v.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
    v.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    v.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    v.extend_from_slice(&(EHDR as u16).to_le_bytes());
    v.extend_from_slice(&(PHDR as u16).to_le_bytes());
    v.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    v.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
                                  // Program header: one read+execute segment holding the whole file.
    v.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    v.extend_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    v.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    v.extend_from_slice(&BASE.to_le_bytes()); // p_vaddr
    v.extend_from_slice(&BASE.to_le_bytes()); // p_paddr
    v.extend_from_slice(&total.to_le_bytes()); // p_filesz
    v.extend_from_slice(&total.to_le_bytes()); // p_memsz
    v.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
    v.extend_from_slice(code);
    debug_assert_eq!(v.len() as u64, total);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// Starts `path`, retrying while it is busy: another test thread's fork may hold a copy of
    /// the fd that wrote it until that child execs (`ETXTBSY`).
    fn command(path: &std::path::Path, out: bool) -> std::io::Result<std::process::Child> {
        let mut tries = 0;
        loop {
            let mut cmd = std::process::Command::new(path);
            if out {
                cmd.stdout(std::process::Stdio::piped());
            }
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => return other,
            }
        }
    }

    /// Writes `elf` as an executable into a fresh temp dir; returns the dir and the path.
    fn install(name: &str, elf: &[u8]) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("agentrl-{name}-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, elf).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, path)
    }

    /// The ELF runs; with no child to wait for, the init exits 0 at once. (The full path,
    /// the init reaping pid 2 and reporting its status, runs in the integration tests.)
    #[test]
    fn runs_and_exits_without_children() {
        let (dir, path) = install("init", &elf());
        let out = command(&path, true).unwrap().wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "init with no children exits 0: {out:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The inits make themselves non-dumpable: a process of the same uid and without
    /// capabilities (what a box process would be, were it on the init's uid) cannot trace it.
    /// (Both inits start with the same `prctl`; the idle one stays up to be probed.)
    #[test]
    fn idle_is_not_dumpable() {
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to run the init on a spare uid");
            return;
        }
        const UID: u32 = 0x5A00_0FFF; // a spare id at the top of the boxes' range
        let (dir, path) = install("idle-dump", &idle_elf());
        let mut tries = 0;
        let mut child = loop {
            match std::process::Command::new(&path).uid(UID).gid(UID).spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => break other.unwrap(),
            }
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        let target = child.id() as libc::pid_t;
        // SAFETY: the forked child makes raw system calls only, then exits.
        let helper = unsafe { libc::fork() };
        assert!(helper >= 0);
        if helper == 0 {
            // SAFETY: raw system calls with integer arguments; exit_group does not return.
            unsafe {
                let id = UID as usize;
                crate::sys::syscall3(libc::SYS_setgroups, 0, 0, 0);
                crate::sys::syscall3(libc::SYS_setresgid, id, id, id);
                crate::sys::syscall3(libc::SYS_setresuid, id, id, id);
                let r = crate::sys::syscall6(
                    libc::SYS_ptrace,
                    libc::PTRACE_SEIZE as usize,
                    target as usize,
                    0,
                    0,
                    0,
                    0,
                );
                let code = if r < 0 { (-r) as usize } else { 0 };
                crate::sys::syscall3(libc::SYS_exit_group, code, 0, 0);
            }
            unreachable!();
        }
        let mut status = 0;
        // SAFETY: reaping our own child.
        assert_eq!(unsafe { libc::waitpid(helper, &mut status, 0) }, helper);
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            libc::EPERM,
            "a same-uid process could trace the idle init"
        );
    }

    /// The idle init waits until it is killed.
    #[test]
    fn idle_waits_until_killed() {
        let (dir, path) = install("idle", &idle_elf());
        let mut child = command(&path, false).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the idle init keeps waiting"
        );
        child.kill().unwrap();
        let st = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
