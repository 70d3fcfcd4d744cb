//! A [`RunRequest`] checked and converted to what the child needs ([`Prepared`]): C strings,
//! the `PATH` candidates of the program, the working directory in the box, the input files'
//! paths; every refusal of a bad request is an [`Error::Invalid`] here, before the queue.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use crate::config::{self, RunRequest, SandboxConfig, WORK_DIR};
use crate::error::{Error, Result};
use crate::limits::Limits;

/// A run, validated and converted to what the child needs.
pub(crate) struct Prepared {
    pub argv: Vec<CString>,
    pub exec_paths: Vec<CString>,
    pub env: Vec<CString>,
    pub cwd: CString,
    pub stdin: Vec<u8>,
    pub files: Vec<(Vec<String>, Vec<u8>)>,
    pub collect: Vec<(String, Vec<String>)>,
    pub limits: Limits,
    /// Run on the slot's warm interpreter (the program is `/work/__main__.py`).
    pub warm: bool,
    /// For a session step: the overlay to attach at `/work`, and the session's host id.
    pub session: Option<(OwnedFd, u32)>,
    /// See [`RunRequest::cancel`].
    pub cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// See [`RunRequest::pass_fds`]. Taken (and this copy closed) once handed to the warm
    /// interpreter: from then on only the run holds them, so that its end shows at once to
    /// whoever holds the other end of a pipe or socket.
    pub pass_fds: Mutex<Vec<Arc<OwnedFd>>>,
    /// See [`RunRequest::tee`]: the writer and its two senders, taken by the run. Started
    /// here, on the caller's thread: a thread started by the slot's would join the slot's
    /// cgroup (v1) and count against the run's pids limit.
    pub tee: Mutex<
        Option<(
            crate::tee::Tee,
            crate::tee::TeeSender,
            crate::tee::TeeSender,
        )>,
    >,
}

/// Checks `req` against `config` and converts it (see the module doc).
pub(super) fn prepare(config: &SandboxConfig, req: RunRequest) -> Result<Prepared> {
    let limits = req.limits.unwrap_or_else(|| config.limits.clone());
    limits.validate()?;
    if req.warm && config.warm.is_none() {
        return Err(Error::invalid(
            "warm",
            "this sandbox has no warm interpreter",
        ));
    }
    if req.session.is_some() && req.warm {
        return Err(Error::invalid("warm", "session steps run cold"));
    }
    if req.session.is_some() && !req.files.is_empty() {
        return Err(Error::invalid(
            "files",
            "a session's files are given when it is created; a step writes files with its command",
        ));
    }
    if !req.pass_fds.is_empty() && !req.warm {
        return Err(Error::invalid(
            "pass_fds",
            "only a warm run (run_python) takes fds",
        ));
    }
    if req.pass_fds.len() > config::MAX_PASS_FDS {
        return Err(Error::invalid(
            "pass_fds",
            format!(
                "{} fds given, at most {} can be passed",
                req.pass_fds.len(),
                config::MAX_PASS_FDS
            ),
        ));
    }
    if req.warm && !req.files.iter().any(|(n, _)| n == "__main__.py") {
        return Err(Error::invalid("files", "a warm run needs __main__.py"));
    }
    if req.argv.is_empty() {
        return Err(Error::invalid("argv", "is empty"));
    }
    if req.argv[0].is_empty() {
        return Err(Error::invalid("argv", "argv[0] is empty"));
    }
    let argv = req
        .argv
        .iter()
        .map(|a| config::cstring("argv", a))
        .collect::<Result<Vec<_>>>()?;
    let mut env: Vec<(String, String)> = config.env.clone();
    for (k, v) in req.env {
        config::env_entry(&k, &v)?;
        env.retain(|(k2, _)| *k2 != k);
        env.push((k, v));
    }
    let env_c = env
        .iter()
        .map(|(k, v)| config::env_entry(k, v))
        .collect::<Result<Vec<_>>>()?;
    let prog = &req.argv[0];
    let exec_paths = if prog.contains(&b'/') {
        vec![argv[0].clone()]
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or("/usr/bin:/bin");
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| {
                let mut p = d.trim_end_matches('/').as_bytes().to_vec();
                p.push(b'/');
                p.extend_from_slice(prog);
                config::cstring("argv", &p)
            })
            .collect::<Result<Vec<_>>>()?
    };
    let cwd = match req.cwd {
        None => WORK_DIR.to_string(),
        Some(c) if c.starts_with('/') => {
            config::absolute_box_path("cwd", std::path::Path::new(&c))?
                .to_string_lossy()
                .into_owned()
        }
        Some(c) => format!("{WORK_DIR}/{}", config::relative_path("cwd", &c)?.join("/")),
    };
    let cwd = config::cstring("cwd", cwd.as_bytes())?;
    let mut files = Vec::with_capacity(req.files.len());
    let mut total: u64 = 0;
    for (name, data) in req.files {
        let parts = config::relative_path("files", &name)?;
        total += data.len() as u64;
        files.push((parts, data));
    }
    if total > limits.tmpfs_bytes {
        return Err(Error::invalid(
            "files",
            format!(
                "{total} bytes of input files do not fit the {} byte tmpfs",
                limits.tmpfs_bytes
            ),
        ));
    }
    let collect = req
        .collect
        .into_iter()
        .map(|n| config::relative_path("collect", &n).map(|p| (n, p)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Prepared {
        argv,
        exec_paths,
        env: env_c,
        cwd,
        stdin: req.stdin,
        files,
        collect,
        limits,
        warm: req.warm,
        cancel: req.cancel,
        pass_fds: Mutex::new(req.pass_fds),
        tee: Mutex::new(match req.tee {
            Some(fds) => Some(
                crate::tee::Tee::start(fds)
                    .map_err(|e| Error::setup_io("starting the live-output writer", e))?,
            ),
            None => None,
        }),
        session: match req.session {
            Some(s) => Some((s.step_mount()?, s.host_id)),
            None => None,
        },
    })
}
