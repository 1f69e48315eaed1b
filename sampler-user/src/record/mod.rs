//! The `record` command: drives a sampling [`Session`] and writes the profile file.
//!
//! Owns: the progress line, streaming `.pyebpf` outputs while sampling (the timeline of the
//! samples, a chunk about every second, so a killed run keeps its samples; memory holds only a
//! second of it) and writing the other outputs at the end from the profile's counts, one per
//! `-o` (each written atomically, see [`crate::output::OutputFile`]); the sampling session
//! itself (collector, threads, stop conditions, signals, summary) lives in [`session`], which
//! `top` drives too. Input: a validated [`RecordConfig`]. Output: the profile files and a
//! [`RecordSummary`].
//!
//! Threads: `drain` empties the ring buffer into batches; the session's thread runs the
//! [`pipeline`]: the Python stage ([`python`]: which processes are Python, their frames
//! resolved as each sample arrives; its attaches run on two worker threads) and the stack
//! builder ([`stack`]: native unwinding, symbolization and the `--native` merge, everything
//! expensive cached per file or per unique frame), counting each sample into the profile.
//! Items flow drain → pipeline in order, one message per batch.

mod drain;
mod idle;
mod latency;
mod pipeline;
mod python;
pub mod session;
mod signals;
mod spawn;
mod stack;
mod summary;

use std::io::Write as _;
use std::time::Duration;

use crate::config::RecordConfig;
use crate::output::Format;
use crate::profile::{Profile, Sample};
use crate::saved::SavedWriter;
use session::{Ended, Flow, Session};

#[cfg(test)]
pub(crate) use idle::monotonic_ns;
pub use summary::{PyProcLine, RecordSummary};

/// Sets glibc's allocator up for a long run, before anything large is read: a fixed
/// `M_MMAP_THRESHOLD` (glibc's own default, 128 KiB) keeps every large temporary — the kernel
/// BTF at start-up, the symbol tables an attach reads — in its own mapping, returned whole when
/// it is freed. Left dynamic, glibc raises the threshold to the largest block freed so far (the
/// 5.5 MB BTF), so later temporaries up to that size are carved from the freeing thread's arena,
/// whose top glibc then keeps resident (`malloc_trim` releases free chunks inside an arena but
/// not a thread arena's top): `record --all` beside `churn.py` grew by 5 MiB in one step when
/// a large binary was started on the host. `M_ARENA_MAX` 1: the threads share one arena (they
/// allocate per batch and per attach, not per sample), so no thread keeps its own pages.
pub(crate) fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's parameters (under the allocator's own lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Hands the allocator's free memory back to the kernel, at most once a second whoever asks
/// (the attach workers when their queue empties, the pipeline on its timed work). glibc keeps
/// what a thread freed in that thread's arena and returns it only from the top of the heap:
/// the large temporaries of attaches (symbol tables read to decide a process is not Python)
/// and symbolization left a long `--all` run with process churn growing by about 1 MiB a
/// minute of freed but resident memory while its live heap stayed near 2 MB.
pub(crate) fn release_free_memory() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_S: AtomicU64 = AtomicU64::new(0);
    let now = idle::monotonic_ns() / 1_000_000_000;
    let last = LAST_S.load(Ordering::Relaxed);
    if now == last
        || LAST_S
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks and trims the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

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
    /// A second signal came while the outputs were written: these were not.
    #[error("interrupted by a second signal: not written: {outputs}")]
    Aborted {
        /// The outputs not written, comma-separated.
        outputs: String,
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

/// A `.pyebpf` output streamed while sampling: a batch about every second.
struct Stream {
    index: usize,
    writer: Option<SavedWriter<std::io::BufWriter<Box<dyn std::io::Write + Send>>>>,
    failed: Option<std::io::Error>,
}

/// How often a streamed saved profile gets a batch.
const STREAM_EVERY: Duration = Duration::from_secs(1);

impl Stream {
    /// Writes `samples` (the ones since the last batch); an error stops this stream.
    fn batch(&mut self, profile: &Profile, samples: &[Sample]) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        if let Err(e) = w.write_batch(profile, samples) {
            self.failed = Some(e);
            self.writer = None;
        }
    }

    /// The last batch and the end chunk.
    fn finish(&mut self, profile: &Profile, samples: &[Sample]) -> std::io::Result<()> {
        self.batch(profile, samples);
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        match self.writer.take() {
            Some(w) => w.finish(&profile.meta).map(drop),
            None => Ok(()),
        }
    }
}

/// Runs `record` to completion and writes the output. `argv` is stored in the run metadata.
pub fn run(cfg: &RecordConfig, argv: &[String]) -> Result<RecordSummary, RecordError> {
    tune_allocator();
    let streamed = cfg.outputs.iter().any(|(_, f)| *f == Format::Pyebpf);
    let mut session = Session::start(cfg.session.clone(), argv, streamed)?;
    let mut progress = summary::Progress::new(cfg.progress);
    let mut streams: Option<Vec<Stream>> = None;
    // Ticks only for what needs them: the streams' batches and the progress line.
    let tick_every = (streamed || cfg.progress).then_some(STREAM_EVERY);
    session.run(tick_every, |profile, samples, tick| {
        // The first tick comes at once: the start metadata is known, the streams open.
        let streams = streams.get_or_insert_with(|| open_streams(cfg, profile));
        for s in streams.iter_mut() {
            s.batch(profile, &samples);
        }
        progress.tick(
            tick.elapsed,
            profile.sample_count(),
            profile.process_count(),
        );
        Flow::Continue
    });
    let ended = session.finish();
    progress.finish();
    let Ended {
        mut profile,
        timeline,
        summary,
    } = ended?;
    profile.file_names = cfg.file_names;
    let mut stderr = std::io::stderr().lock();
    let _ = summary.print(&mut stderr);
    let streams = streams.unwrap_or_else(|| open_streams(cfg, &profile));
    write_outputs(cfg, &profile, &timeline, streams, &mut stderr)?;
    tracing::debug!("stop: outputs written");
    Ok(summary)
}

/// Opens every `.pyebpf` output for streaming; one that fails is reported when the outputs are
/// written.
fn open_streams(cfg: &RecordConfig, profile: &Profile) -> Vec<Stream> {
    cfg.outputs
        .iter()
        .enumerate()
        .filter(|(_, (_, format))| *format == Format::Pyebpf)
        .map(|(index, (file, _))| {
            let opened = file.stream().and_then(|w| {
                SavedWriter::new(std::io::BufWriter::with_capacity(1 << 16, w), &profile.meta)
            });
            let (writer, failed) = match opened {
                Ok(w) => (Some(w), None),
                Err(e) => (None, Some(e)),
            };
            Stream {
                index,
                writer,
                failed,
            }
        })
        .collect()
}

/// Writes every output of the run: the streamed ones are finished first, then the others are
/// rendered. A file that fails does not stop the others: earlier failures are printed here,
/// the last one is returned. After a second signal the output being written is abandoned (its
/// temporary file removed) and the rest are skipped.
fn write_outputs(
    cfg: &RecordConfig,
    profile: &Profile,
    timeline: &[Sample],
    mut streams: Vec<Stream>,
    stderr: &mut std::io::StderrLock<'_>,
) -> Result<(), RecordError> {
    let mut failed = None;
    let mut skipped = Vec::new();
    // Streamed outputs first (a last batch and the end chunk: quick), then the rendered ones.
    let order = (0..cfg.outputs.len())
        .filter(|i| streams.iter().any(|s| s.index == *i))
        .chain((0..cfg.outputs.len()).filter(|i| !streams.iter().any(|s| s.index == *i)));
    let order: Vec<usize> = order.collect();
    for i in order {
        let (file, format) = &cfg.outputs[i];
        let result = if let Some(s) = streams.iter_mut().find(|s| s.index == i) {
            s.finish(profile, timeline)
        } else if signals::aborted() {
            skipped.push(file.path().display().to_string());
            continue;
        } else {
            file.write(|w| format.render(profile, &mut signals::Abortable(w)))
        };
        match result {
            Ok(()) => {
                let to = if file.is_stdout() {
                    "stdout".into()
                } else {
                    file.path().display().to_string()
                };
                let _ = writeln!(stderr, "Wrote {} to {to}", format.describe());
            }
            Err(_) if signals::aborted() => skipped.push(file.path().display().to_string()),
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
    if !skipped.is_empty() {
        let e = RecordError::Aborted {
            outputs: skipped.join(", "),
        };
        if let Some(earlier) = failed.replace(e) {
            let _ = writeln!(stderr, "pyebpf: {earlier}");
        }
    }
    failed.map_or(Ok(()), Err)
}
