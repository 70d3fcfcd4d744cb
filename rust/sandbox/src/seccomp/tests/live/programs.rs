//! Live tests of real programs (`/bin/true`, a shell with coreutils, Python) under the filter.

use super::*;

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
        let mut strings: Vec<CString> = args.iter().map(|a| CString::new(*a).unwrap()).collect();
        let argc = strings.len();
        strings.extend(std::env::vars().map(|(k, v)| CString::new(format!("{k}={v}")).unwrap()));
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
