//! Waiting out kernel resources that are busy for a moment (a cgroup whose last process is
//! still exiting, a mount with a writer that is about to let go).

use std::io;
use std::time::{Duration, Instant};

/// The first pause of [`backoff`].
pub const FIRST_PAUSE: Duration = Duration::from_micros(50);

/// Sleeps with exponential back-off, starting at [`FIRST_PAUSE`] and capped at 10 ms.
pub fn backoff(pause: &mut Duration) {
    std::thread::sleep(*pause);
    *pause = (*pause * 2).min(Duration::from_millis(10));
}

/// Runs `op` again, with [`backoff`] in between, while it fails with `EBUSY` and `timeout` has
/// not passed since the first try; returns its last result.
pub fn while_busy<T>(timeout: Duration, mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        match op() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                backoff(&mut pause)
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_retried_until_it_clears_and_other_errors_return_at_once() {
        let mut tries = 0;
        let r = while_busy(Duration::from_secs(5), || {
            tries += 1;
            if tries < 4 {
                Err(io::Error::from_raw_os_error(libc::EBUSY))
            } else {
                Ok(tries)
            }
        });
        assert_eq!(r.unwrap(), 4);
        let mut tries = 0;
        let r: io::Result<()> = while_busy(Duration::from_secs(5), || {
            tries += 1;
            Err(io::Error::from_raw_os_error(libc::ENOENT))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOENT));
        assert_eq!(tries, 1);
        let r: io::Result<()> = while_busy(Duration::from_millis(20), || {
            Err(io::Error::from_raw_os_error(libc::EBUSY))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EBUSY));
    }
}
