//! What a warm run's `/proc/self/cmdline` and `/proc/self/environ` show ([`ShownArgs`]),
//! installed with `PR_SET_MM_MAP`.

use super::wire::Env;

/// The kernel's `struct prctl_mm_map` (`PR_SET_MM_MAP`): the addresses `/proc/PID/stat`,
/// `cmdline` and `environ` are read from.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct MmMap {
    pub(super) start_code: u64,
    pub(super) end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    pub(super) arg_start: u64,
    pub(super) arg_end: u64,
    pub(super) env_start: u64,
    pub(super) env_end: u64,
    auxv: u64,
    auxv_size: u32,
    pub(super) exe_fd: u32,
}

/// What a run's `/proc/self/cmdline` and `/proc/self/environ` show: `<interpreter>
/// __main__.py` and the run's environment, as for a cold `python __main__.py`, rather than
/// the warm interpreter's bootstrap command and its own start-up environment. Made once per
/// interpreter (the argument block lives, leaked, in the heap every run inherits); installed
/// in each run with `PR_SET_MM_MAP`, which needs no privilege when it leaves the executable
/// alone. Where that fails (a kernel without `CONFIG_CHECKPOINT_RESTORE`, a data limit below
/// the heap) the run keeps the interpreter's.
pub(super) struct ShownArgs {
    /// The interpreter's memory layout, from `/proc/self/stat` (`None`: unreadable).
    pub(super) map: Option<MmMap>,
    /// `argv[0]`, NUL, `__main__.py`, NUL.
    pub(super) args: &'static [u8],
}

impl ShownArgs {
    pub(super) fn new() -> Self {
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        let mut args = argv0.to_vec();
        args.extend_from_slice(b"\0__main__.py\0");
        let map = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| Self::parse_stat(&s));
        Self {
            map,
            args: Vec::leak(args),
        }
    }

    /// The fields of `/proc/self/stat` that `PR_SET_MM_MAP` sets (all but `brk`, which moves).
    pub(super) fn parse_stat(stat: &str) -> Option<MmMap> {
        // Fields from the third on, after the command name in parentheses.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let f: Vec<u64> = rest
            .split(' ')
            .map(|x| x.trim().parse().unwrap_or(0))
            .collect();
        let field = |n: usize| f.get(n - 3).copied().filter(|&v| v != 0);
        Some(MmMap {
            start_code: field(26)?,
            end_code: field(27)?,
            start_stack: field(28)?,
            start_data: field(45)?,
            end_data: field(46)?,
            start_brk: field(47)?,
            arg_start: field(48)?,
            arg_end: field(49)?,
            env_start: field(50)?,
            env_end: field(51)?,
            exe_fd: u32::MAX,
            ..MmMap::default()
        })
    }

    /// In the run: points the argument block at `args` and, when the run's environment is not
    /// the interpreter's (`env`), the environment block at a copy of it. Best effort.
    pub(super) fn install(&self, env: Option<&Env>) {
        let Some(mut map) = self.map else { return };
        map.arg_start = self.args.as_ptr() as u64;
        map.arg_end = map.arg_start + self.args.len() as u64;
        if let Some(env) = env {
            let mut block = Vec::new();
            for (k, v) in env {
                block.extend_from_slice(k.as_bytes());
                block.push(b'=');
                block.extend_from_slice(v.as_bytes());
                block.push(0);
            }
            if !block.is_empty() {
                let block = Vec::leak(block);
                map.env_start = block.as_ptr() as u64;
                map.env_end = map.env_start + block.len() as u64;
            }
        }
        // SAFETY: brk(0) only reads the current break; prctl reads `map`, a valid struct of
        // the size given, and changes only what /proc reports of this process.
        unsafe {
            map.brk = libc::syscall(libc::SYS_brk, 0usize) as u64;
            libc::prctl(
                libc::PR_SET_MM,
                libc::PR_SET_MM_MAP as libc::c_ulong,
                &map as *const MmMap as libc::c_ulong,
                std::mem::size_of::<MmMap>() as libc::c_ulong,
                0 as libc::c_ulong,
            );
        }
    }
}
