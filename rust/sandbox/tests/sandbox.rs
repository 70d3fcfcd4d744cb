//! End-to-end tests of the sandbox crate with real programs (needs root; this project's CI
//! and developer machines run as root).

use std::sync::OnceLock;

use agentrl_sandbox::{Error, LimitKind, Limits, RunRequest, Sandbox, SandboxConfig, Status};

fn sandbox() -> &'static Sandbox {
    static SB: OnceLock<Sandbox> = OnceLock::new();
    SB.get_or_init(|| Sandbox::new(SandboxConfig::default()).expect("sandbox set-up"))
}

fn sh(script: &str) -> RunRequest {
    RunRequest {
        argv: vec![
            b"/bin/sh".to_vec(),
            b"-c".to_vec(),
            script.as_bytes().to_vec(),
        ],
        ..Default::default()
    }
}

fn limits(f: impl FnOnce(&mut Limits)) -> Option<Limits> {
    let mut l = Limits::default();
    f(&mut l);
    Some(l)
}

/// Host processes whose command line contains `marker` (tests run in parallel, so other
/// boxes may be alive: each test marks its own processes).
fn processes_with(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                out.push(cmd);
            }
        }
    }
    out
}

#[test]
fn true_is_ok() {
    let r = sandbox()
        .run(RunRequest {
            argv: vec![b"/bin/true".to_vec()],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{r:?}");
    assert_eq!(r.exit_code, Some(0));
    assert!(r.denied_syscalls.is_empty(), "{r:?}");
    assert!(r.wall_time_s > 0.0 && r.wall_time_s < 5.0);
}

#[test]
fn exit_code_and_streams() {
    let mut req = sh("cat; echo err >&2; exit 3");
    req.stdin = b"hello\n".to_vec();
    let r = sandbox().run(req).unwrap();
    assert_eq!(r.status, Status::RuntimeError);
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.stdout, b"hello\n");
    assert_eq!(r.stderr, b"err\n");
}

#[test]
fn non_utf8_output_is_preserved() {
    let r = sandbox()
        .run(sh(r"printf '\377\376\000x'; printf '\200' >&2"))
        .unwrap();
    assert_eq!(r.stdout, b"\xff\xfe\x00x");
    assert_eq!(r.stderr, b"\x80");
}

#[test]
fn output_is_capped_and_drained() {
    let mut req = sh("head -c 1000000 /dev/zero; echo done >&2");
    req.limits = limits(|l| l.max_output_bytes = 1000);
    let r = sandbox().run(req).unwrap();
    assert_eq!(r.status, Status::OutputLimit, "{r:?}");
    assert_eq!(r.limit, Some(LimitKind::Output));
    assert!(r.stdout_truncated && !r.stderr_truncated);
    assert_eq!(r.stdout.len(), 1000);
    assert_eq!(
        r.stderr, b"done\n",
        "the writer was not blocked: the rest was drained"
    );
}

#[test]
fn wall_clock_kills_the_whole_box() {
    let mut req = sh("sleep 30.417 & sleep 30.417");
    req.limits = limits(|l| l.wall_time_s = 0.3);
    let r = sandbox().run(req).unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert_eq!(r.limit, Some(LimitKind::WallTime));
    assert!(r.wall_time_s < 3.0, "{r:?}");
    let left = processes_with("30.417");
    assert!(left.is_empty(), "a box process survived: {left:?}");
}

#[test]
fn cpu_time_limit() {
    let mut req = sh("while :; do :; done");
    req.limits = limits(|l| {
        l.cpu_time_s = 0.3;
        l.wall_time_s = 10.0
    });
    let r = sandbox().run(req).unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert_eq!(r.limit, Some(LimitKind::CpuTime));
    assert!(r.cpu_time_s >= 0.25 && r.wall_time_s < 5.0, "{r:?}");
}

#[test]
fn memory_limit() {
    // The shell keeps the whole command substitution in memory: it grows until the cgroup
    // kills it.
    let mut req = sh("x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo ${#x}");
    req.limits = limits(|l| l.memory_bytes = 48 << 20);
    let r = sandbox().run(req).unwrap();
    assert_eq!(r.status, Status::MemoryLimit, "{r:?}");
    assert_eq!(r.limit, Some(LimitKind::Memory));
    let peak = r.peak_memory_bytes.unwrap();
    assert!(peak > 20 << 20 && peak <= 64 << 20, "peak {peak}");
}

#[test]
fn fork_bomb_is_contained() {
    let mut req = sh("b() { b | b & }; b; sleep 1.731");
    req.limits = limits(|l| {
        l.max_pids = 16;
        l.wall_time_s = 1.0
    });
    let r = sandbox().run(req).unwrap();
    assert_ne!(r.status, Status::SandboxError, "{r:?}");
    let left = processes_with("1.731");
    assert!(left.is_empty(), "a box process survived: {left:?}");
}

#[test]
fn files_in_and_out_and_no_symlink_escape() {
    let mut req = sh("cat in/data.txt > out.txt; ln -s /etc/passwd link; ln -s out.txt rel; mkdir d; echo x > d/y");
    req.files = vec![("in/data.txt".into(), b"payload".to_vec())];
    req.collect = vec![
        "out.txt".into(),
        "link".into(),
        "rel".into(),
        "missing".into(),
        "d/y".into(),
    ];
    let r = sandbox().run(req).unwrap();
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let names: Vec<&str> = r.files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["out.txt", "d/y"]);
    assert_eq!(r.files[0].1, b"payload");
}

#[test]
fn identity_and_view() {
    let r = sandbox()
        .run(sh("id -u; id -g; hostname; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; ls /; echo $$; ls /proc | grep -c '^[0-9]'"))
        .unwrap();
    let out = String::from_utf8_lossy(&r.stdout).to_string();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], ["1000", "1000", "sandbox"], "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("CapBnd:\t0000000000000000"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(
        !out.contains("farm") && !out.contains("old_root"),
        "host dirs visible: {out}"
    );
    assert!(
        lines.contains(&"2"),
        "the shell is not pid 2 (under the box init) of its namespace: {out}"
    );
}

#[test]
fn denied_syscalls_are_named() {
    let r = sandbox()
        .run(RunRequest {
            argv: vec![b"unshare".to_vec(), b"-U".to_vec(), b"true".to_vec()],
            ..Default::default()
        })
        .unwrap();
    assert_ne!(r.status, Status::Ok, "{r:?}");
    assert!(r.denied_syscalls.iter().any(|s| s == "unshare"), "{r:?}");
}

#[test]
fn missing_command_is_a_runtime_error() {
    let r = sandbox()
        .run(RunRequest {
            argv: vec![b"no-such-command".to_vec()],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.status, Status::RuntimeError);
    assert_eq!(r.exit_code, Some(127));
}

#[test]
fn environment_is_explicit() {
    std::env::set_var("AGENTRL_HOST_SECRET", "leak");
    let mut req = sh("env");
    req.env = vec![("MINE".into(), "1".into())];
    let r = sandbox().run(req).unwrap();
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(
        out.contains("MINE=1") && out.contains("HOME=/work"),
        "{out}"
    );
    assert!(!out.contains("AGENTRL_HOST_SECRET"), "{out}");
}

#[test]
fn runs_do_not_see_each_other() {
    let r1 = sandbox()
        .run(sh(
            "echo a > /work/left; echo b > /tmp/left; echo c > /dev/shm/left",
        ))
        .unwrap();
    assert_eq!(r1.status, Status::Ok, "{r1:?}");
    let r2 = sandbox().run(sh("ls -A /work /tmp /dev/shm")).unwrap();
    assert!(
        !String::from_utf8_lossy(&r2.stdout).contains("left"),
        "{r2:?}"
    );
}

#[test]
fn concurrent_runs_from_many_threads() {
    let handles: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                for j in 0..10 {
                    let r = sandbox().run(sh(&format!("echo {i}-{j}"))).unwrap();
                    assert_eq!(r.status, Status::Ok, "{r:?}");
                    assert_eq!(r.stdout, format!("{i}-{j}\n").into_bytes());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn bad_requests_are_rejected() {
    let sb = sandbox();
    let bad = |req: RunRequest, field: &str| match sb.run(req) {
        Err(Error::InvalidArgument { field: f, .. }) => assert_eq!(f, field),
        other => panic!("expected InvalidArgument({field}), got {other:?}"),
    };
    bad(RunRequest::default(), "argv");
    bad(
        RunRequest {
            argv: vec![b"a\0b".to_vec()],
            ..Default::default()
        },
        "argv",
    );
    let mut r = sh("true");
    r.files = vec![("../x".into(), vec![])];
    bad(r, "files");
    let mut r = sh("true");
    r.collect = vec!["/etc/passwd".into()];
    bad(r, "collect");
    let mut r = sh("true");
    r.env = vec![("A=B".into(), "c".into())];
    bad(r, "env");
    let mut r = sh("true");
    r.limits = limits(|l| l.memory_bytes = 0);
    bad(r, "memory_bytes");
    let mut r = sh("true");
    r.cwd = Some("../up".into());
    bad(r, "cwd");
}

#[test]
fn sessions_persist_reset_and_branch() {
    let sb = sandbox();
    let files = vec![("init.txt".to_string(), b"v0".to_vec())];
    let s = sb.session(files, 8 << 20).unwrap();
    let step = |script: &str| {
        let mut req = sh(script);
        req.session = Some(s.clone());
        let r = sb.run(req).unwrap();
        assert_eq!(r.status, Status::Ok, "{r:?}");
        String::from_utf8(r.stdout).unwrap()
    };
    assert_eq!(step("cat init.txt; echo one > a.txt"), "v0");
    assert_eq!(step("cat a.txt; echo v1 > init.txt"), "one\n");
    let snap = s.snapshot().unwrap();
    assert_eq!(step("cat init.txt; rm a.txt; echo two > b.txt"), "v1\n");
    s.reset().unwrap();
    assert_eq!(
        step("ls"),
        "a.txt\ninit.txt\n",
        "reset returns to the snapshot"
    );
    s.restore(&snap).unwrap();
    assert_eq!(step("cat a.txt init.txt"), "one\nv1\n");
    // Another session sees none of it; a plain run neither.
    let other = sb.session(vec![], 1 << 20).unwrap();
    let mut req = sh("ls -A");
    req.session = Some(other.clone());
    assert_eq!(sb.run(req).unwrap().stdout, b"");
    assert_eq!(sb.run(sh("ls -A")).unwrap().stdout, b"");
    // Collect from the session.
    let mut req = sh("echo out > o.txt");
    req.session = Some(s.clone());
    req.collect = vec!["o.txt".into(), "init.txt".into()];
    let r = sb.run(req).unwrap();
    assert_eq!(r.files.len(), 2, "{r:?}");
    s.close();
    other.close();
    let mut req = sh("true");
    req.session = Some(s.clone());
    assert!(matches!(sb.run(req), Err(Error::Closed)));
}

#[test]
fn the_program_is_not_init_signals_and_file_size_work() {
    let r = sandbox().run(sh("kill -TERM $$; sleep 5")).unwrap();
    assert_eq!(
        (r.status, r.signal),
        (Status::Signaled, Some(libc::SIGTERM)),
        "{r:?}"
    );
    let mut req = sh("exec head -c 3000000 /dev/zero > big");
    req.limits = limits(|l| l.max_file_bytes = 1 << 20);
    let r = sandbox().run(req).unwrap();
    assert_eq!(r.status, Status::Signaled, "{r:?}");
    assert_eq!(r.limit, Some(LimitKind::FileSize), "{r:?}");
    // Orphans are reaped by the box's init; the program's exit status is still its own.
    let r = sandbox().run(sh("(sleep 0.1 &) ; exit 7")).unwrap();
    assert_eq!(
        (r.status, r.exit_code),
        (Status::RuntimeError, Some(7)),
        "{r:?}"
    );
}

#[test]
fn a_forked_child_refuses_runs_and_leaves_the_parents_sandbox_alone() {
    let sb = sandbox();
    assert_eq!(sb.run(sh("true")).unwrap().status, Status::Ok);
    // SAFETY: the child only calls `run` (refused before any lock is taken), `close` (returns
    // at once in a copy), then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let refused = matches!(
            sb.run(sh("true")),
            Err(Error::Setup { ref what, .. }) if what.contains("fork")
        );
        sb.close();
        // SAFETY: ending the forked child without running the parent's destructors.
        unsafe { libc::_exit(if refused { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );
    assert_eq!(sb.run(sh("true")).unwrap().status, Status::Ok);
}

#[test]
fn an_interrupted_run_is_cancelled_and_its_box_killed() {
    let marker = "agentrl-interrupt-test-3141";
    let t0 = std::time::Instant::now();
    let mut asked = 0;
    let r = sandbox()
        .run_interruptible(
            sh(&format!("sleep 30; : {marker}")),
            std::time::Duration::from_millis(50),
            || {
                asked += 1;
                asked >= 4 // about 0.2 s in
            },
        )
        .unwrap();
    assert_eq!(r.status, Status::SandboxError, "{r:?}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{r:?}");
    assert_eq!(asked, 4);
    // Nothing of the run is left on the host.
    assert!(processes_with(marker).is_empty());
}
