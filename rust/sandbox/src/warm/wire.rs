//! The wire format of a run request on the control socket: what the host encodes and the
//! interpreter decodes (network policy, rlimits, cwd, environment).

use std::ffi::CString;

/// Serialises what the interpreter's child needs: network policy, rlimits, cwd, env.
pub(super) fn encode(
    network: bool,
    rlimits: &[(u32, libc::rlimit64)],
    cwd: &[u8],
    env: &[CString],
) -> Vec<u8> {
    let mut v = vec![u8::from(network)];
    v.extend_from_slice(&(rlimits.len() as u32).to_le_bytes());
    for (r, l) in rlimits {
        v.extend_from_slice(&r.to_le_bytes());
        v.extend_from_slice(&l.rlim_cur.to_le_bytes());
        v.extend_from_slice(&l.rlim_max.to_le_bytes());
    }
    v.extend_from_slice(&(cwd.len() as u32).to_le_bytes());
    v.extend_from_slice(cwd);
    v.extend_from_slice(&encode_env(env.iter().map(|e| e.as_bytes())));
    v
}

/// The environment part of a request: a count, then each `NAME=value` with its length.
pub fn encode_env<'a>(entries: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut v = (entries.len() as u32).to_le_bytes().to_vec();
    for b in entries {
        v.extend_from_slice(&(b.len() as u32).to_le_bytes());
        v.extend_from_slice(b);
    }
    v
}

/// A run's environment, as `(name, value)` pairs in order.
pub type Env = Vec<(String, String)>;

/// A decoded request.
pub(super) struct Request {
    pub network: bool,
    pub rlimits: Vec<(u32, libc::rlimit64)>,
    pub cwd: CString,
    /// `None` when the run's environment is `own_env` as given to [`decode`].
    pub env: Option<Env>,
}

/// Parses a request payload. `own_env` is the interpreter's own environment as
/// [`encode_env`] writes it: a request with that very environment decodes it as `None`
/// (nothing to build or to install, the common case).
pub(super) fn decode(p: &[u8], own_env: &[u8]) -> Option<Request> {
    let mut i = 0usize;
    let take = |i: &mut usize, n: usize| -> Option<&[u8]> {
        let s = p.get(*i..*i + n)?;
        *i += n;
        Some(s)
    };
    let u32_ = |i: &mut usize| take(i, 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")));
    let u64_ = |i: &mut usize| take(i, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
    let network = *take(&mut i, 1)?.first()? != 0;
    let n = u32_(&mut i)? as usize;
    let mut rlimits = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let r = u32_(&mut i)?;
        let cur = u64_(&mut i)?;
        let max = u64_(&mut i)?;
        rlimits.push((
            r,
            libc::rlimit64 {
                rlim_cur: cur,
                rlim_max: max,
            },
        ));
    }
    let n = u32_(&mut i)? as usize;
    let cwd = CString::new(take(&mut i, n)?).ok()?;
    if p.get(i..)? == own_env {
        return Some(Request {
            network,
            rlimits,
            cwd,
            env: None,
        });
    }
    let n = u32_(&mut i)? as usize;
    let mut env = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let m = u32_(&mut i)? as usize;
        let kv = String::from_utf8(take(&mut i, m)?.to_vec()).ok()?;
        let (k, v) = kv.split_once('=')?;
        env.push((k.to_string(), v.to_string()));
    }
    (i == p.len()).then_some(Request {
        network,
        rlimits,
        cwd,
        env: Some(env),
    })
}
