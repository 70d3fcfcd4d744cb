//! Live output: a copy of what a run's stdout and stderr capture is written, as it is read,
//! to host fds of the caller's (`RunRequest::tee`), on a writer thread of its own so that a
//! slow reader (a terminal, a pipe nobody drains) never holds up the supervisor and its
//! limits. The chunks keep the order the supervisor read them in, across both streams; what
//! is written is what the verdict keeps (up to the output cap). After the run the verdict
//! waits for the writer at most [`FINISH_WAIT`]: a reader that stops reading gets the rest
//! later (the writer goes on alone), and the verdict is not held up.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

/// How long [`Tee::finish`] waits for the writer to write what is queued.
pub const FINISH_WAIT: Duration = Duration::from_secs(5);

/// Which of the two host fds a chunk goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The sending side, one clone per captured stream.
#[derive(Debug, Clone)]
pub struct TeeSender {
    tx: Sender<(Stream, Vec<u8>)>,
    stream: Stream,
}

impl TeeSender {
    /// Queues a copy of `data` (never blocks).
    pub fn send(&self, data: &[u8]) {
        if !data.is_empty() {
            let _ = self.tx.send((self.stream, data.to_vec()));
        }
    }
}

/// The writer thread; [`Tee::finish`] waits until everything queued is written.
pub struct Tee {
    /// Closed (the sender dropped) by the writer when it is done.
    done: Receiver<()>,
}

impl Tee {
    /// Starts the writer for `(stdout, stderr)` and returns it with one sender per stream.
    pub fn start(fds: (Arc<OwnedFd>, Arc<OwnedFd>)) -> io::Result<(Tee, TeeSender, TeeSender)> {
        let (tx, rx) = channel::<(Stream, Vec<u8>)>();
        let (done_tx, done) = channel::<()>();
        std::thread::Builder::new()
            .name("agentrl-tee".into())
            .spawn(move || {
                let _done = done_tx;
                let (mut out_ok, mut err_ok) = (true, true);
                for (stream, chunk) in rx {
                    let (fd, ok) = match stream {
                        Stream::Stdout => (&fds.0, &mut out_ok),
                        Stream::Stderr => (&fds.1, &mut err_ok),
                    };
                    // A reader that went away (EPIPE) or another error: that stream stops.
                    if *ok && write_all(fd, &chunk).is_err() {
                        *ok = false;
                    }
                }
            })?;
        let out = TeeSender {
            tx: tx.clone(),
            stream: Stream::Stdout,
        };
        let err = TeeSender {
            tx,
            stream: Stream::Stderr,
        };
        Ok((Tee { done }, out, err))
    }

    /// Waits (at most `wait`) for the writer to write what was queued; past that it goes on
    /// alone. Call it after dropping the senders. Returns whether everything was written.
    pub fn finish(self, wait: Duration) -> bool {
        matches!(
            self.done.recv_timeout(wait),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
        )
    }
}

/// Writes all of `data` to `fd`, waiting for it to take more where it is non-blocking.
fn write_all(fd: &OwnedFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: data is valid for its length; fd is open for as long as `fd` lives.
        let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
        if n >= 0 {
            data = &data[n as usize..];
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, -1) };
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;

    fn pipe() -> (std::fs::File, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: a valid array of two fds.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh fds we own.
        unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                OwnedFd::from_raw_fd(fds[1]),
            )
        }
    }

    #[test]
    fn chunks_reach_their_stream_in_order() {
        let (mut r, w) = pipe();
        let w = Arc::new(w);
        let (tee, out, err) = Tee::start((w.clone(), w)).unwrap();
        out.send(b"one ");
        err.send(b"two ");
        out.send(b"");
        out.send(b"three");
        drop((out, err));
        assert!(tee.finish(FINISH_WAIT));
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "one two three");
    }

    #[test]
    fn a_reader_that_never_reads_does_not_hold_up_the_finish() {
        let (mut r, w) = pipe();
        let w = Arc::new(w);
        let (tee, out, err) = Tee::start((w.clone(), w)).unwrap();
        let chunk = vec![b'x'; 1 << 20]; // far more than a pipe holds
        out.send(&chunk);
        drop((out, err));
        let t0 = std::time::Instant::now();
        assert!(!tee.finish(Duration::from_millis(200)));
        assert!(t0.elapsed() < Duration::from_secs(2));
        // The writer goes on alone: the reader still gets all of it.
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 1 << 20);
    }

    #[test]
    fn a_closed_reader_stops_the_stream_not_the_run() {
        let (r, w) = pipe();
        drop(r);
        let (r2, w2) = pipe();
        let (tee, out, err) = Tee::start((Arc::new(w), Arc::new(w2))).unwrap();
        out.send(b"lost");
        err.send(b"kept");
        drop((out, err));
        assert!(tee.finish(FINISH_WAIT));
        let mut s = String::new();
        let mut r2 = r2;
        r2.read_to_string(&mut s).unwrap();
        assert_eq!(s, "kept");
    }
}
