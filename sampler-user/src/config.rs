//! Validated configuration of the `record` command.
//!
//! Owns: turning the raw request (built by `main` from clap's parse) into a [`RecordConfig`],
//! checking everything a user can get wrong *before* sampling starts: no such pid, an output
//! file that cannot be written, a rate or stack size out of range. Each failure is a
//! [`ConfigError`] whose message is one clear line. The library never imports clap.

#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use sampler_common::{DEFAULT_STACK_BYTES, STACK_SIZE_CLASSES};

use crate::output::{self, Format, OutputFile};
use crate::privilege::RunAs;
use crate::profile::FileNames;

/// What to profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Every process on the host (`--all`).
    All,
    /// These processes (`-p PID`, repeatable) and, with `--subprocesses`, their children.
    Pids(Vec<u32>),
    /// Start this command and profile it and its children (`-- cmd args`).
    Command(Vec<String>),
}

/// The raw `record` request, as the CLI parsed it.
#[derive(Clone, Debug, Default)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "one field per CLI flag: the request mirrors the command line"
)]
pub struct RecordRequest {
    /// `--all`.
    pub all: bool,
    /// `-p/--pid`.
    pub pids: Vec<u32>,
    /// Command after `--`.
    pub command: Vec<String>,
    /// `-d/--duration` in seconds (`None`: until Ctrl-C, or until the command exits).
    pub duration_s: Option<f64>,
    /// `-r/--rate` in Hz.
    pub rate_hz: u64,
    /// `-o/--output`, repeatable: every file is written from the same run.
    pub outputs: Vec<PathBuf>,
    /// `-f/--format` (only with at most one `-o`).
    pub format: Option<String>,
    /// `--native`.
    pub native: bool,
    /// `--kernel`.
    pub kernel: bool,
    /// `--threads`.
    pub threads: bool,
    /// `--gil`.
    pub gil: bool,
    /// `--idle`: off-CPU time too (a wall-clock profile).
    pub idle: bool,
    /// `--subprocesses` (for `-p`).
    pub subprocesses: bool,
    /// `--stack-size` in bytes.
    pub stack_bytes: Option<u32>,
    /// `--ring-size` in bytes (`None`: sized for the rate).
    pub ring_bytes: Option<u64>,
    /// `--as-root`: run the command as root under `sudo` (default: as the invoking user).
    pub command_as_root: bool,
    /// Show a progress line (stderr is a terminal and not `--quiet`).
    pub progress: bool,
    /// `--full-filenames`.
    pub full_filenames: bool,
}

/// What a sampling session samples: the part of `record`'s configuration that `top` shares.
#[derive(Clone, Debug)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent switches of the run, each read by a different stage"
)]
pub struct SessionConfig {
    /// What to profile.
    pub target: Target,
    /// How long to sample; `None` until Ctrl-C (or the command's exit).
    pub duration: Option<Duration>,
    /// Samples per second per CPU.
    pub rate_hz: u64,
    /// Unwind native user stacks.
    pub native: bool,
    /// Add kernel frames.
    pub kernel: bool,
    /// Add a thread level under each process.
    pub threads: bool,
    /// Keep only samples of threads holding the GIL.
    pub gil: bool,
    /// Sample target Python threads off a CPU too (`--idle`: a wall-clock profile).
    pub idle: bool,
    /// Follow children of `-p` targets.
    pub subprocesses: bool,
    /// User-stack bytes copied per sample (0 without `--native`).
    pub stack_bytes: u32,
    /// Ring-buffer size in bytes (`--ring-size`); 0: sized for the rate, the CPUs and the
    /// stack copy (`collect::ring_bytes_for`).
    pub ring_bytes: u32,
    /// Who runs `-- COMMAND` (`None`: pyebpf's own user).
    pub run_as: Option<RunAs>,
}

/// A validated `record` configuration.
#[derive(Debug)]
pub struct RecordConfig {
    /// What to sample.
    pub session: SessionConfig,
    /// Where to write the outputs (resolved and checked, see [`OutputFile`]) and in which
    /// format, in the order given (at least one).
    pub outputs: Vec<(OutputFile, Format)>,
    /// Show a progress line.
    pub progress: bool,
    /// Which file names the rendered outputs show (saved profiles keep both).
    pub file_names: FileNames,
}

/// A user error found before sampling.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Neither `--all`, `-p` nor a command.
    #[error("nothing to profile: give --all, -p PID or -- COMMAND")]
    NoTarget,
    /// More than one target kind.
    #[error("give only one of --all, -p PID and -- COMMAND")]
    ConflictingTargets,
    /// `-p` names a process that does not exist.
    #[error("no such process: {pid}")]
    NoSuchPid {
        /// The pid.
        pid: u32,
    },
    /// `-p` names a process that cannot be profiled (kernel thread, zombie, a thread id).
    #[error("cannot profile pid {pid}: {why}")]
    NotProfilable {
        /// The pid.
        pid: u32,
        /// Why, e.g. "a kernel thread (kthreadd)".
        why: String,
    },
    /// Rate out of range.
    #[error("invalid rate {rate} Hz: choose 1 to 10000")]
    BadRate {
        /// The rate asked for.
        rate: u64,
    },
    /// Duration not positive, or beyond [`MAX_DURATION_S`].
    #[error("invalid duration {secs} s: choose more than 0 and at most {MAX_DURATION_S} s")]
    BadDuration {
        /// The duration asked for.
        secs: f64,
    },
    /// Stack size out of range.
    #[error("invalid --stack-size {bytes}: choose 1 to {max} bytes", max = STACK_SIZE_CLASSES[STACK_SIZE_CLASSES.len() - 1])]
    BadStackSize {
        /// The size asked for.
        bytes: u32,
    },
    /// `--ring-size` not a power of two in range.
    #[error(
        "invalid --ring-size {bytes}: use a power of two from {min} to {max} bytes for this \
         stack size",
        min = crate::collect::min_ring_bytes(*stack_bytes),
        max = crate::collect::MAX_RING_BYTES
    )]
    BadRingSize {
        /// The size asked for.
        bytes: u64,
        /// The stack copy it must hold four of.
        stack_bytes: u32,
    },
    /// Unknown `-f` value.
    #[error("unknown format '{name}': use flamegraph, collapsed, speedscope, pprof or pyebpf")]
    BadFormat {
        /// The name given.
        name: String,
    },
    /// `-f` with more than one `-o`.
    #[error(
        "-f/--format needs a single -o: with several, each file's format comes from its extension"
    )]
    FormatWithManyOutputs,
    /// The same `-o` twice.
    #[error("output file {} given twice", path.display())]
    DuplicateOutput {
        /// The output path.
        path: PathBuf,
    },
    /// The output cannot be written.
    #[error(transparent)]
    Output(#[from] output::OutputError),
}

/// The longest `-d` (a year): longer is a typo, and `1e20` must not overflow a `Duration`.
pub const MAX_DURATION_S: f64 = 365.0 * 24.0 * 3600.0;

impl ConfigError {
    /// Whether this is a usage error (a value out of range, conflicting flags: exit status 2)
    /// rather than a state of the system (a process that is gone, a file that cannot be
    /// written: status 1).
    pub fn is_usage(&self) -> bool {
        !matches!(
            self,
            ConfigError::NoSuchPid { .. }
                | ConfigError::NotProfilable { .. }
                | ConfigError::Output(_)
        )
    }
}

/// Every pid names a running user-space process (`record -p`, `top -p`): not 0, not a kernel
/// thread, not a zombie, not a thread of another process.
pub fn check_pids(pids: &[u32]) -> Result<(), ConfigError> {
    pids.iter().try_for_each(|&pid| check_pid(pid))
}

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags (`include/linux/sched.h`).
const PF_KTHREAD: u64 = 0x0020_0000;

fn check_pid(pid: u32) -> Result<(), ConfigError> {
    let not = |why: String| Err(ConfigError::NotProfilable { pid, why });
    if pid == 0 {
        return Err(ConfigError::NoSuchPid { pid });
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Err(ConfigError::NoSuchPid { pid });
    };
    // `pid (comm) state ppid … flags` (proc_pid_stat(5)): comm may hold spaces and parentheses,
    // so the fields are read after its last ')'.
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return Err(ConfigError::NoSuchPid { pid });
    };
    let comm = crate::printable::printable(stat.get(open + 1..close).unwrap_or(""));
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let state = fields.first().copied().unwrap_or("?");
    // Field 9 (`flags`), the 7th after the state.
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    if flags & PF_KTHREAD != 0 {
        return not(format!(
            "a kernel thread ({comm}), it runs no user-space code"
        ));
    }
    if state == "Z" || state == "X" {
        return not(format!(
            "{comm} has exited (a zombie waiting for its parent)"
        ));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    if let Some(tgid) = tgid.filter(|&t| t != pid) {
        return not(format!("a thread of process {tgid}; use -p {tgid}"));
    }
    Ok(())
}

/// The sampling rate is 1 to 10 000 Hz per CPU (`record -r`, `top -r`).
pub fn check_rate(rate: u64) -> Result<(), ConfigError> {
    if (1..=10_000).contains(&rate) {
        Ok(())
    } else {
        Err(ConfigError::BadRate { rate })
    }
}

impl RecordConfig {
    /// Validates a request. `now` names the default output file (`pyebpf-<now>.<ext>`).
    pub fn new(mut req: RecordRequest, now: &str) -> Result<Self, ConfigError> {
        let kinds = usize::from(req.all)
            + usize::from(!req.pids.is_empty())
            + usize::from(!req.command.is_empty());
        let target = match kinds {
            0 => return Err(ConfigError::NoTarget),
            1 if req.all => Target::All,
            1 if !req.pids.is_empty() => Target::Pids(std::mem::take(&mut req.pids)),
            1 => Target::Command(std::mem::take(&mut req.command)),
            _ => return Err(ConfigError::ConflictingTargets),
        };
        if let Target::Pids(pids) = &target {
            check_pids(pids)?;
        }
        check_rate(req.rate_hz)?;
        let duration = match req.duration_s {
            Some(s) if !(s > 0.0 && s <= MAX_DURATION_S) => {
                return Err(ConfigError::BadDuration { secs: s });
            }
            Some(s) => Some(Duration::from_secs_f64(s)),
            None => None,
        };
        // Checked with or without --native: a bad value is a mistake either way.
        let want = req.stack_bytes.unwrap_or(DEFAULT_STACK_BYTES);
        let class = *STACK_SIZE_CLASSES
            .iter()
            .find(|&&c| c >= want)
            .filter(|_| want > 0)
            .ok_or(ConfigError::BadStackSize { bytes: want })?;
        let stack_bytes = if req.native { class } else { 0 };
        let ring_bytes = match req.ring_bytes {
            None => 0,
            Some(bytes) => u32::try_from(bytes)
                .ok()
                .filter(|b| {
                    b.is_power_of_two()
                        && (crate::collect::min_ring_bytes(stack_bytes)
                            ..=crate::collect::MAX_RING_BYTES)
                            .contains(b)
                })
                .ok_or(ConfigError::BadRingSize { bytes, stack_bytes })?,
        };
        let outputs = outputs(std::mem::take(&mut req.outputs), req.format.as_deref(), now)?;
        let run_as = match &target {
            Target::Command(_) if !req.command_as_root => RunAs::sudo_user(),
            _ => None,
        };
        Ok(RecordConfig {
            session: SessionConfig {
                target,
                duration,
                rate_hz: req.rate_hz,
                native: req.native,
                kernel: req.kernel,
                threads: req.threads,
                gil: req.gil,
                idle: req.idle,
                subprocesses: req.subprocesses,
                stack_bytes,
                ring_bytes,
                run_as,
            },
            outputs,
            progress: req.progress,
            file_names: if req.full_filenames {
                FileNames::Full
            } else {
                FileNames::Short
            },
        })
    }
}

/// The output files and their formats: each `-o` with its extension's format (or `-f`'s, for a
/// single `-o`), or the default name; each resolved and checked writable.
fn outputs(
    paths: Vec<PathBuf>,
    format: Option<&str>,
    now: &str,
) -> Result<Vec<(OutputFile, Format)>, ConfigError> {
    let forced = format
        .map(|name| {
            Format::from_name(name).ok_or_else(|| ConfigError::BadFormat {
                name: name.to_string(),
            })
        })
        .transpose()?;
    if forced.is_some() && paths.len() > 1 {
        return Err(ConfigError::FormatWithManyOutputs);
    }
    let outputs: Vec<(PathBuf, Format)> = if paths.is_empty() {
        let format = forced.unwrap_or(Format::Flamegraph);
        let path = PathBuf::from(format!("pyebpf-{now}.{}", format.extension()));
        vec![(path, format)]
    } else {
        paths
            .into_iter()
            .map(|path| {
                let format = forced
                    .or_else(|| Format::from_path(&path))
                    .unwrap_or(Format::Flamegraph);
                (path, format)
            })
            .collect()
    };
    for (i, (path, _)) in outputs.iter().enumerate() {
        if outputs[..i].iter().any(|(p, _)| p == path) {
            return Err(ConfigError::DuplicateOutput { path: path.clone() });
        }
    }
    let mut files = Vec::with_capacity(outputs.len());
    for (path, format) in outputs {
        files.push((OutputFile::open(&path)?, format));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> RecordRequest {
        RecordRequest {
            all: true,
            rate_hz: 99,
            outputs: vec![std::env::temp_dir().join("pyebpf-config-test.svg")],
            ..RecordRequest::default()
        }
    }

    #[test]
    fn defaults() {
        let c = RecordConfig::new(req(), "x").unwrap();
        assert_eq!(c.session.target, Target::All);
        assert_eq!(c.outputs[0].1, Format::Flamegraph);
        assert_eq!(c.outputs.len(), 1);
        assert_eq!(c.session.stack_bytes, 0);
        let c = RecordConfig::new(
            RecordRequest {
                native: true,
                ..req()
            },
            "x",
        )
        .unwrap();
        assert_eq!(c.session.stack_bytes, DEFAULT_STACK_BYTES);
        let c = RecordConfig::new(
            RecordRequest {
                native: true,
                stack_bytes: Some(9000),
                ..req()
            },
            "x",
        )
        .unwrap();
        assert_eq!(c.session.stack_bytes, 16 << 10);
    }

    #[test]
    fn user_errors() {
        assert!(matches!(
            RecordConfig::new(
                RecordRequest {
                    all: false,
                    ..req()
                },
                "x"
            ),
            Err(ConfigError::NoTarget)
        ));
        assert!(matches!(
            RecordConfig::new(
                RecordRequest {
                    pids: vec![1],
                    ..req()
                },
                "x"
            ),
            Err(ConfigError::ConflictingTargets)
        ));
        assert!(matches!(
            RecordConfig::new(
                RecordRequest {
                    all: false,
                    pids: vec![u32::MAX - 1],
                    ..req()
                },
                "x"
            ),
            Err(ConfigError::NoSuchPid { .. })
        ));
        assert!(matches!(
            RecordConfig::new(
                RecordRequest {
                    rate_hz: 0,
                    ..req()
                },
                "x"
            ),
            Err(ConfigError::BadRate { .. })
        ));
        assert!(matches!(
            RecordConfig::new(
                RecordRequest {
                    outputs: vec!["/nonexistent-pyebpf/x.svg".into()],
                    ..req()
                },
                "x"
            ),
            Err(ConfigError::Output(_))
        ));
        assert!(matches!(
            RecordConfig::new(
                RecordRequest {
                    format: Some("xml".into()),
                    ..req()
                },
                "x"
            ),
            Err(ConfigError::BadFormat { .. })
        ));
        let e = RecordConfig::new(
            RecordRequest {
                native: true,
                stack_bytes: Some(1 << 20),
                ..req()
            },
            "x",
        )
        .unwrap_err();
        assert!(e.to_string().contains("--stack-size"));
    }

    #[test]
    fn values_out_of_range_are_usage_errors() {
        // Out of range also without --native, and durations that overflow a Duration.
        for bad in [
            RecordRequest {
                stack_bytes: Some(1 << 20),
                ..req()
            },
            RecordRequest {
                stack_bytes: Some(0),
                ..req()
            },
            RecordRequest {
                duration_s: Some(1e20),
                ..req()
            },
            RecordRequest {
                duration_s: Some(-1.0),
                ..req()
            },
            RecordRequest {
                duration_s: Some(f64::NAN),
                ..req()
            },
            RecordRequest {
                rate_hz: 10_001,
                ..req()
            },
        ] {
            let e = RecordConfig::new(bad, "x").unwrap_err();
            assert!(e.is_usage(), "{e}");
            assert_eq!(e.to_string().lines().count(), 1);
        }
    }

    #[test]
    fn kernel_threads_zombies_and_thread_ids_are_refused() {
        // kthreadd is pid 2 on every Linux host we run on (outside a pid namespace).
        let e = check_pids(&[2]).unwrap_err();
        assert!(e.to_string().contains("kernel thread"), "{e}");
        assert!(!e.is_usage());
        // A zombie: a child that exited and is not reaped yet.
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap()
            .contains(") Z")
        {
            assert!(t0.elapsed().as_secs() < 10, "child never became a zombie");
            std::thread::sleep(Duration::from_millis(10));
        }
        let e = check_pids(&[pid]).unwrap_err();
        assert!(e.to_string().contains("zombie"), "{e}");
        drop(child);
        // The id of one of this process's threads.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let e = check_pids(&[tid]).unwrap_err();
        assert!(e.to_string().contains("a thread of process"), "{e}");
        done_tx.send(()).unwrap();
        t.join().unwrap();
        check_pids(&[std::process::id()]).unwrap();
    }

    #[test]
    fn format_from_extension() {
        let c = RecordConfig::new(
            RecordRequest {
                outputs: vec![std::env::temp_dir().join("a.txt")],
                ..req()
            },
            "x",
        )
        .unwrap();
        assert_eq!(c.outputs[0].1, Format::Collapsed);
    }

    #[test]
    fn several_outputs() {
        let dir = std::env::temp_dir();
        let names = [
            "r.pyebpf",
            "r.svg",
            "r.txt",
            "r.speedscope.json",
            "r.pb.gz",
            "r.bin",
        ];
        let c = RecordConfig::new(
            RecordRequest {
                outputs: names.iter().map(|n| dir.join(n)).collect(),
                ..req()
            },
            "x",
        )
        .unwrap();
        let formats: Vec<Format> = c.outputs.iter().map(|o| o.1).collect();
        assert_eq!(
            formats,
            [
                Format::Pyebpf,
                Format::Flamegraph,
                Format::Collapsed,
                Format::Speedscope,
                Format::Pprof,
                Format::Flamegraph
            ]
        );
        assert_eq!(c.outputs[0].0.path(), dir.join("r.pyebpf"));
        // -f names the format of a single -o, whatever its extension…
        let c = RecordConfig::new(
            RecordRequest {
                outputs: vec![dir.join("r.out")],
                format: Some("pyebpf".into()),
                ..req()
            },
            "x",
        )
        .unwrap();
        assert_eq!(c.outputs.len(), 1);
        assert_eq!(c.outputs[0].0.path(), dir.join("r.out"));
        assert_eq!(c.outputs[0].1, Format::Pyebpf);
        // … or of the default name.
        let c = RecordConfig::new(
            RecordRequest {
                outputs: Vec::new(),
                format: Some("collapsed".into()),
                ..req()
            },
            "20250101-000000",
        )
        .unwrap();
        assert_eq!(c.outputs.len(), 1);
        assert_eq!(
            c.outputs[0].0.path(),
            Path::new("pyebpf-20250101-000000.txt")
        );
        assert_eq!(c.outputs[0].1, Format::Collapsed);
        // -f with several -o is refused, in one line.
        let e = RecordConfig::new(
            RecordRequest {
                outputs: vec![dir.join("a.svg"), dir.join("a.txt")],
                format: Some("collapsed".into()),
                ..req()
            },
            "x",
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::FormatWithManyOutputs));
        assert_eq!(e.to_string().lines().count(), 1);
        let e = RecordConfig::new(
            RecordRequest {
                outputs: vec![dir.join("a.svg"), dir.join("a.txt"), dir.join("a.svg")],
                ..req()
            },
            "x",
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::DuplicateOutput { .. }), "{e}");
        // Every output is checked before sampling, not only the first.
        let e = RecordConfig::new(
            RecordRequest {
                outputs: vec![dir.join("a.svg"), "/nonexistent-pyebpf/x.pyebpf".into()],
                ..req()
            },
            "x",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent-pyebpf/x.pyebpf"),
            "{e}"
        );
    }
}
