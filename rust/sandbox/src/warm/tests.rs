//! Tests of the request wire format and of the shown arguments.

use std::ffi::CString;

use super::shown_args::ShownArgs;
use super::wire::{decode, encode, encode_env};

fn request(env: &[&str]) -> Vec<u8> {
    let env: Vec<CString> = env.iter().map(|e| CString::new(*e).unwrap()).collect();
    let rlimits = [(
        3u32,
        libc::rlimit64 {
            rlim_cur: 5,
            rlim_max: 6,
        },
    )];
    encode(true, &rlimits, b"/work", &env)
}

#[test]
fn requests_round_trip() {
    let own = encode_env([b"A=1".as_slice()].into_iter());
    let req = decode(&request(&["PATH=/bin", "X=a=b"]), &own).unwrap();
    assert!(req.network);
    assert_eq!(req.rlimits.len(), 1);
    assert_eq!(
        (req.rlimits[0].1.rlim_cur, req.rlimits[0].1.rlim_max),
        (5, 6)
    );
    assert_eq!(req.cwd.as_bytes(), b"/work");
    let env = req.env.unwrap();
    assert_eq!(
        env,
        [("PATH".into(), "/bin".into()), ("X".into(), "a=b".into())]
    );
}

#[test]
fn the_interpreters_own_environment_is_not_rebuilt() {
    let own = encode_env([b"A=1".as_slice(), b"B=2"].into_iter());
    assert!(decode(&request(&["A=1", "B=2"]), &own)
        .unwrap()
        .env
        .is_none());
    // Order counts (the run's environment keeps the request's order).
    let other = decode(&request(&["B=2", "A=1"]), &own).unwrap();
    assert_eq!(other.env.unwrap().len(), 2);
    assert_eq!(decode(&request(&[]), &own).unwrap().env.unwrap(), []);
}

#[test]
fn the_shown_arguments_are_the_interpreters_first_and_main() {
    let shown = ShownArgs::new();
    let map = shown
        .map
        .expect("this process's /proc/self/stat is readable");
    assert!(map.start_code < map.end_code && map.arg_start < map.arg_end);
    assert!(map.env_start <= map.env_end && map.exe_fd == u32::MAX);
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap();
    assert_eq!(shown.args, [argv0, b"\0__main__.py\0"].concat());
    assert!(ShownArgs::parse_stat("1 (a) S").is_none());
}

#[test]
fn malformed_requests_are_refused() {
    let own = encode_env(std::iter::empty());
    let full = request(&["A=1"]);
    for cut in 0..full.len() {
        assert!(decode(&full[..cut], &own).is_none(), "cut at {cut}");
    }
    let mut long = full.clone();
    long.push(0);
    assert!(decode(&long, &own).is_none(), "trailing bytes");
    assert!(decode(&request(&["NOEQUALS"]), &own).is_none());
}
