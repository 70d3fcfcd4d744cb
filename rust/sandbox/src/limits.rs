//! Resource limits of one run.

use crate::error::{Error, Result};

/// Resource limits applied to one run. `None` means "not limited" where that is allowed.
///
/// Enforcement: wall clock by the supervisor (the whole pid namespace is killed); CPU time by
/// the supervisor polling the slot cgroup (all threads and processes counted) with
/// `RLIMIT_CPU` as a per-process backstop; memory and pids by the slot cgroup; output bytes by
/// the supervisor (captured up to the cap, the rest drained and discarded); file size, open
/// files and core dumps by rlimits (`RLIMIT_CORE` is 1 byte, never 0: see [`crate::rlimit`]);
/// `/tmp` and the work dir by the tmpfs size.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Wall-clock limit in seconds.
    pub wall_time_s: f64,
    /// CPU time limit in seconds, all threads and processes of the run together.
    pub cpu_time_s: f64,
    /// Memory limit in bytes (cgroup memory, page cache of the tmpfs included).
    pub memory_bytes: u64,
    /// Maximum number of processes and threads alive at once.
    pub max_pids: u64,
    /// Capture cap for stdout and for stderr, each.
    pub max_output_bytes: u64,
    /// Largest file the run may write (`RLIMIT_FSIZE`); also the cap for collected files.
    pub max_file_bytes: u64,
    /// Maximum number of open files per process (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// Size of the tmpfs that holds the work dir, `/tmp` and `/dev/shm`.
    pub tmpfs_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wall_time_s: 10.0,
            cpu_time_s: 10.0,
            memory_bytes: 512 << 20,
            max_pids: 64,
            max_output_bytes: 1 << 20,
            max_file_bytes: 64 << 20,
            max_open_files: 256,
            tmpfs_bytes: 64 << 20,
        }
    }
}

/// Largest wall or CPU time accepted (a day): beyond that a value is surely a unit mistake.
pub const MAX_SECONDS: f64 = 86_400.0;

/// Smallest memory limit: enough for the kernel to start a program (`execve`) in the box.
pub const MIN_MEMORY_BYTES: u64 = 8 << 20;

/// A size in words: whole MiB or KiB where it is one, else bytes.
fn size(v: u64) -> String {
    if v >= 1 << 20 && v % (1 << 20) == 0 {
        format!("{} MiB", v >> 20)
    } else if v >= 1 << 10 && v % (1 << 10) == 0 {
        format!("{} KiB", v >> 10)
    } else {
        format!("{v} bytes")
    }
}

impl Limits {
    /// The field names, as [`Error::InvalidArgument`] names them.
    pub const FIELDS: [&'static str; 8] = [
        "wall_time_s",
        "cpu_time_s",
        "memory_bytes",
        "max_pids",
        "max_output_bytes",
        "max_file_bytes",
        "max_open_files",
        "tmpfs_bytes",
    ];

    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("wall_time_s", self.wall_time_s),
            ("cpu_time_s", self.cpu_time_s),
        ] {
            if !v.is_finite() || v <= 0.0 {
                return Err(Error::invalid(
                    name,
                    format!("must be a positive number of seconds, got {v}"),
                ));
            }
            if v > MAX_SECONDS {
                return Err(Error::invalid(
                    name,
                    format!("must be at most {MAX_SECONDS} seconds, got {v}"),
                ));
            }
        }
        // (name, value, least, a size in bytes)
        let ints = [
            // The floor keeps the kernel's own start of a program (execve) inside the limit:
            // until its execve completes, a box process still shares the spawning process's
            // memory, and a cgroup OOM kill at that moment would take the host process with it.
            ("memory_bytes", self.memory_bytes, MIN_MEMORY_BYTES, true),
            ("max_pids", self.max_pids, 1, false),
            ("max_output_bytes", self.max_output_bytes, 1, true),
            ("max_file_bytes", self.max_file_bytes, 1, true),
            ("max_open_files", self.max_open_files, 16, false),
            ("tmpfs_bytes", self.tmpfs_bytes, 64 << 10, true),
        ];
        for (name, v, min, bytes) in ints {
            if v < min {
                let message = if v == 0 && min == 1 {
                    "must be positive, got 0".to_owned()
                } else if bytes {
                    format!("must be at least {}, got {}", size(min), size(v))
                } else {
                    format!("must be at least {min}, got {v}")
                };
                return Err(Error::invalid(name, message));
            }
        }
        if self.max_pids > 1 << 22 {
            return Err(Error::invalid(
                "max_pids",
                format!("must be at most {}, got {}", 1 << 22, self.max_pids),
            ));
        }
        if self.max_open_files > 1 << 20 {
            return Err(Error::invalid(
                "max_open_files",
                format!("must be at most {}, got {}", 1 << 20, self.max_open_files),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_said_in_words() {
        let mut l = Limits {
            memory_bytes: (8 << 20) - 1,
            ..Limits::default()
        };
        let e = l.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid memory_bytes: must be at least 8 MiB, got 8388607 bytes"
        );
        l.memory_bytes = 4 << 20;
        let e = l.validate().unwrap_err().to_string();
        assert!(e.ends_with("got 4 MiB"), "{e}");
        l.memory_bytes = 1 << 30;
        l.tmpfs_bytes = 1 << 10;
        let e = l.validate().unwrap_err().to_string();
        assert!(e.ends_with("at least 64 KiB, got 1 KiB"), "{e}");
        assert!(Limits::FIELDS.contains(&"tmpfs_bytes"));
    }

    #[test]
    fn defaults_are_valid() {
        Limits::default().validate().unwrap();
    }

    #[test]
    fn each_bad_field_is_named() {
        type Mutation = Box<dyn Fn(&mut Limits)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("wall_time_s", Box::new(|l| l.wall_time_s = 0.0)),
            ("wall_time_s", Box::new(|l| l.wall_time_s = f64::NAN)),
            ("cpu_time_s", Box::new(|l| l.cpu_time_s = -1.0)),
            ("cpu_time_s", Box::new(|l| l.cpu_time_s = f64::INFINITY)),
            ("memory_bytes", Box::new(|l| l.memory_bytes = 0)),
            ("max_pids", Box::new(|l| l.max_pids = 0)),
            ("max_output_bytes", Box::new(|l| l.max_output_bytes = 0)),
            ("max_file_bytes", Box::new(|l| l.max_file_bytes = 0)),
            ("max_open_files", Box::new(|l| l.max_open_files = 3)),
            ("tmpfs_bytes", Box::new(|l| l.tmpfs_bytes = 10)),
        ];
        for (field, mutate) in cases {
            let mut l = Limits::default();
            mutate(&mut l);
            match l.validate() {
                Err(Error::InvalidArgument { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidArgument, got {other:?}"),
            }
        }
    }
}
