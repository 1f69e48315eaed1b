//! The `record` command: drives a sampling [`Session`] and writes the profile file.
//!
//! Owns: the progress line and writing the outputs at the end, one per `-o` (each written
//! atomically); the sampling session itself (collector, threads, stop conditions, signals,
//! summary) lives in [`session`], which `top` drives too. Input: a validated [`RecordConfig`].
//! Output: the profile files and a [`RecordSummary`].
//!
//! Threads: `drain` empties the ring buffer; `pystage` tracks the Python processes (and the
//! kernel's `PY_PROCS`) and resolves each sample's captured Python frames as soon as it
//! arrives; the session's thread builds the stacks ([`stack`]: native unwinding, symbolization
//! and the `--native` merge, everything expensive cached per file or per unique frame).
//! Items flow drain → pystage → stack builder in order on bounded channels.

mod drain;
mod pyattach;
mod pyproc;
#[cfg(test)]
mod pyproc_tests;
mod pystage;
mod pytrack;
pub mod session;
mod signals;
mod spawn;
mod stack;
mod summary;

use std::io::Write as _;

use crate::config::RecordConfig;
use crate::profile::Profile;
use session::{Ended, Flow, Session};

pub use summary::{PyProcLine, RecordSummary};

/// Errors that end a `record` run. Each displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// eBPF load/attach failed.
    #[error(transparent)]
    Collect(#[from] crate::collect::CollectError),
    /// The command to profile could not be started.
    #[error("cannot start {command}: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// Writing the output failed (nothing was left behind).
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The output path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A file-name-safe local timestamp, `YYYYmmdd-HHMMSS`, for default output names.
pub fn timestamp_for_file_name() -> String {
    let now = libc_time();
    // SAFETY: `localtime_r` writes into our zeroed struct; `now` is a valid time_t.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&raw const now, &raw mut tm) };
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

fn libc_time() -> libc::time_t {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as libc::time_t)
}

/// Runs `record` to completion and writes the output. `argv` is stored in the run metadata.
pub fn run(cfg: &RecordConfig, argv: &[String]) -> Result<RecordSummary, RecordError> {
    let mut session = Session::start(cfg.session.clone(), argv)?;
    let mut progress = summary::Progress::new(cfg.progress);
    session.run(|profile, tick| {
        progress.tick(
            tick.elapsed,
            profile.samples().len(),
            profile.process_count(),
        );
        Flow::Continue
    });
    let ended = session.finish();
    progress.finish();
    let Ended { profile, summary } = ended?;
    let mut stderr = std::io::stderr().lock();
    let _ = summary.print(&mut stderr);
    write_outputs(cfg, &profile, &mut stderr)?;
    Ok(summary)
}

/// Writes every output of the run. A file that fails does not stop the others: earlier
/// failures are printed here, the last one is returned.
fn write_outputs(
    cfg: &RecordConfig,
    profile: &Profile,
    stderr: &mut std::io::StderrLock<'_>,
) -> Result<(), RecordError> {
    let mut failed = None;
    for (file, format) in &cfg.outputs {
        match file.write(|w| format.render(profile, w)) {
            Ok(()) => {
                let to = if file.is_stdout() {
                    "stdout".into()
                } else {
                    file.path().display().to_string()
                };
                let _ = writeln!(stderr, "Wrote {} to {to}", format.describe());
            }
            Err(source) => {
                let e = RecordError::Write {
                    path: file.path().to_path_buf(),
                    source,
                };
                if let Some(earlier) = failed.replace(e) {
                    let _ = writeln!(stderr, "pyebpf: {earlier}");
                }
            }
        }
    }
    failed.map_or(Ok(()), Err)
}
