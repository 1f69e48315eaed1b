//! The drain thread: empties the ring buffer continuously, whatever the cost of building
//! stacks, so that a slow moment in user space (first symbolization of a large library, say)
//! does not turn into samples lost in the kernel.
//!
//! Owns: the [`Collector`] for the duration of the run. Input: ring-buffer records, drained
//! when the kernel wakes us (per batch: see `Config::wakeup_bytes`; an exec wakes us at once)
//! or every [`FLUSH_EVERY`] ([`FAST_FLUSH`] while a recently attached Python process may be
//! running). Output: one [`Batch`] of [`Drained`] items per wake-up
//! into the pipeline's input — one message (and at most one wake-up of the pipeline) per
//! batch, never per sample. Kernel stacks are looked up here, right when the sample arrives.
//! When more than [`queue_capacity`] samples wait downstream, new samples are dropped and
//! counted as lost in user space — never silently. [`Drain::finish`] wakes the thread at once
//! (the eventfd of [`super::signals::wake_fd`] in its poll); so does a stop signal (its
//! handler writes the same eventfd), which the thread passes on as [`Input::Wake`]. The
//! thread's last message is [`Input::DrainEnded`].

use std::os::fd::{AsRawFd as _, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::pipeline::Input;
use crate::collect::{CollectError, Collector, CounterTotals, Event, ProgramStats, RawSample};

/// Bytes of queued samples we accept before dropping (and counting) new ones.
const QUEUE_BYTES: usize = 512 << 20;
/// How often the drain thread publishes the kernel's lost-sample count for a live view.
const LOST_EVERY: Duration = Duration::from_millis(500);
/// The longest a sample waits in a quiet ring before it is drained: the kernel wakes us only
/// when an eighth of the ring is used.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// The same while a Python process attached recently may still be running
/// ([`Backlog::flush_fast_for`]): its frames are read from its memory when its samples are
/// built, and a short-lived process (0.1–1 s: a cron job, a CLI tool, a test worker) has exited
/// before a 100 ms flush would hand them over, leaving `[unknown python frame]`s.
pub const FAST_FLUSH: Duration = Duration::from_millis(10);

/// The items of one drain, in ring order.
pub type Batch = Vec<Drained>;

/// The pipeline's link back to the drain: the samples queued downstream (added when a batch
/// is sent, taken off by [`Backlog::done`] when the next stage has handled a batch), and until
/// when the drain flushes every [`FAST_FLUSH`] instead of every [`FLUSH_EVERY`].
#[derive(Clone, Default)]
pub struct Backlog {
    queued: Arc<AtomicUsize>,
    /// `CLOCK_MONOTONIC` ns.
    fast_until_ns: Arc<AtomicU64>,
}

impl Backlog {
    /// `n` samples of a batch were handled.
    pub fn done(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::Relaxed);
    }

    /// Flush every [`FAST_FLUSH`] for the next `d` (a Python process was just attached).
    pub fn flush_fast_for(&self, d: Duration) {
        let until = super::idle::monotonic_ns()
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.fast_until_ns.fetch_max(until, Ordering::Relaxed);
    }

    /// The drain's poll timeout now.
    fn flush_interval(&self) -> Duration {
        if super::idle::monotonic_ns() < self.fast_until_ns.load(Ordering::Relaxed) {
            FAST_FLUSH
        } else {
            FLUSH_EVERY
        }
    }
}

/// Samples in `batch`.
pub fn samples_in(batch: &[Drained]) -> usize {
    batch
        .iter()
        .filter(|d| matches!(d, Drained::Sample(..)))
        .count()
}

/// One item for the stack builder.
pub enum Drained {
    /// A sample, with its kernel stack (innermost first) when one was recorded.
    Sample(RawSample, Option<Vec<u64>>),
    /// A process event.
    Proc(Event),
}

/// Handle of the running drain thread.
pub struct Drain {
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    /// Samples lost in the kernel so far, as last read by the drain thread.
    kernel_lost: Arc<AtomicU64>,
    /// Process events lost in the kernel so far, as last read.
    lost_events: Arc<AtomicU64>,
    /// Samples taken before this kernel time (ns, `CLOCK_MONOTONIC` like `bpf_ktime_get_ns`)
    /// are not part of the run: set-up was still in progress.
    start_ns: Arc<AtomicU64>,
    /// Written to wake the thread from its poll.
    wake: BorrowedFd<'static>,
    handle: JoinHandle<(Collector, Result<(), CollectError>)>,
}

/// Queue length for items of `stack_bytes` of stack each (a Python capture adds up to
/// `PY_MAX_FRAMES` records).
pub fn queue_capacity(stack_bytes: u32) -> usize {
    let per_item = stack_bytes as usize + 256 + size_of::<sampler_common::PyCapture>();
    (QUEUE_BYTES / per_item).clamp(1024, 1 << 20)
}

/// What the drain thread hands back at the end.
pub struct Finished {
    /// Kernel counters.
    pub counters: CounterTotals,
    /// Samples dropped because the queue was full.
    pub dropped: u64,
    /// Statistics of the sampling program, read after the last sample.
    pub program: Option<ProgramStats>,
    /// Statistics of the off-CPU program (`--idle`).
    pub offcpu_program: Option<ProgramStats>,
}

/// Starts draining `collector` into `tx` as batches; at most `queue_capacity(stack_bytes)`
/// samples wait downstream ([`Backlog`]): beyond that, samples are dropped and counted. The
/// channel itself never blocks the drain (a full ring loses samples in the kernel, where they
/// are counted too, but a stalled drain would also delay process events).
///
/// With `hold`, samples are discarded (process events are kept) until [`Drain::begin_now`].
pub fn start(
    mut collector: Collector,
    stack_bytes: u32,
    hold: bool,
    tx: Sender<Input>,
) -> (Drain, Backlog) {
    let backlog = Backlog::default();
    let wake = super::signals::wake_fd();
    let stop = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicU64::new(0));
    let kernel_lost = Arc::new(AtomicU64::new(0));
    let lost_events = Arc::new(AtomicU64::new(0));
    let start_ns = Arc::new(AtomicU64::new(if hold { u64::MAX } else { 0 }));
    let shared = Shared {
        stop: stop.clone(),
        dropped: dropped.clone(),
        kernel_lost: kernel_lost.clone(),
        lost_events: lost_events.clone(),
        start_ns: start_ns.clone(),
        wake,
        backlog: backlog.clone(),
        capacity: queue_capacity(stack_bytes),
    };
    let handle = std::thread::Builder::new()
        .name("pyebpf-drain".into())
        .spawn(move || {
            raise_priority();
            let r = run(&mut collector, &tx, &shared);
            let _ = tx.send(Input::DrainEnded);
            (collector, r)
        })
        .expect("spawn drain thread");
    (
        Drain {
            stop,
            dropped,
            kernel_lost,
            lost_events,
            start_ns,
            wake,
            handle,
        },
        backlog,
    )
}

/// Nice value of the drain thread: it runs for microseconds per batch, and on a loaded host it
/// must not wait behind CPU-bound tasks while the ring fills.
const DRAIN_NICE: i32 = -10;

/// Lowers the calling thread's nice value (Linux applies `setpriority` on a thread id to that
/// thread only); without the privilege it stays as it was.
fn raise_priority() {
    // SAFETY: gettid and setpriority have no memory preconditions.
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, DRAIN_NICE) != 0 {
            tracing::debug!(
                "drain thread priority unchanged: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// What the drain thread shares with its handle.
struct Shared {
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    kernel_lost: Arc<AtomicU64>,
    lost_events: Arc<AtomicU64>,
    start_ns: Arc<AtomicU64>,
    wake: BorrowedFd<'static>,
    backlog: Backlog,
    capacity: usize,
}

/// Whether the eventfd `fd` was written since it was last read (and resets it).
fn woken(fd: BorrowedFd<'_>) -> bool {
    let mut count = [0u8; 8];
    // SAFETY: reads 8 bytes into a live buffer from our non-blocking eventfd.
    unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) == 8 }
}

fn run(c: &mut Collector, tx: &Sender<Input>, sh: &Shared) -> Result<(), CollectError> {
    let mut events = Vec::new();
    let mut lost_read = Instant::now();
    loop {
        if lost_read.elapsed() >= LOST_EVERY {
            lost_read = Instant::now();
            if let Ok(totals) = c.counters() {
                sh.kernel_lost
                    .store(totals.lost_samples(), Ordering::Relaxed);
                sh.lost_events.store(
                    totals.get(sampler_common::Counter::LostProcEvents),
                    Ordering::Relaxed,
                );
            }
        }
        // One last poll after the stop request drains what is already in the buffer.
        let stopping = sh.stop.load(Ordering::Acquire);
        let timeout = if stopping {
            Duration::ZERO
        } else {
            sh.backlog.flush_interval()
        };
        c.poll(timeout, Some(sh.wake), |ev| events.push(ev))?;
        // A stop signal (not our own finish): tell the pipeline, which decides.
        if woken(sh.wake) && !sh.stop.load(Ordering::Acquire) && tx.send(Input::Wake).is_err() {
            return Ok(());
        }
        let start_ns = sh.start_ns.load(Ordering::Acquire);
        let room = sh
            .capacity
            .saturating_sub(sh.backlog.queued.load(Ordering::Relaxed));
        let mut batch = Vec::with_capacity(events.len());
        let mut samples = 0;
        for ev in events.drain(..) {
            let item = match ev {
                Event::Sample(mut s) => {
                    // An off-CPU interval counts from the start of the run on.
                    let before_start = match s.off_cpu.as_mut() {
                        Some(o) => {
                            let kept = super::idle::clip(o, start_ns);
                            s.time_ns = o.t_out;
                            !kept
                        }
                        None => s.time_ns < start_ns,
                    };
                    if before_start {
                        continue;
                    }
                    // The next stage is behind: drop (and count) rather than grow without
                    // bound.
                    if samples >= room {
                        sh.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    samples += 1;
                    let k = (s.kernel_stack_id >= 0)
                        .then(|| c.kernel_stack(s.kernel_stack_id))
                        .flatten();
                    Drained::Sample(s, k)
                }
                other => Drained::Proc(other),
            };
            batch.push(item);
        }
        if !batch.is_empty() {
            sh.backlog.queued.fetch_add(samples, Ordering::Relaxed);
            if tx.send(Input::Batch(batch)).is_err() {
                return Ok(());
            }
        }
        if stopping {
            return Ok(());
        }
    }
}

impl Drain {
    /// Ends the hold of [`start`]: samples from now on are part of the run.
    pub fn begin_now(&self) {
        // CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
        self.start_ns
            .store(super::idle::monotonic_ns(), Ordering::Release);
    }

    /// Stops the thread after a final drain (its last messages, then [`Input::DrainEnded`],
    /// are in the pipeline's input); returns the collector's counters, the user-space drop
    /// count and the program's statistics. The collector (and its channel end) is dropped.
    pub fn finish(self) -> Result<Finished, CollectError> {
        self.stop.store(true, Ordering::Release);
        // Wake the poll.
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd.
        let _ = unsafe { libc::write(self.wake_fd(), one.as_ptr().cast(), one.len()) };
        let (collector, result) = self.handle.join().expect("drain thread panicked");
        result?;
        Ok(Finished {
            counters: collector.counters()?,
            dropped: self.dropped.load(Ordering::Relaxed),
            program: collector.program_stats(),
            offcpu_program: collector.offcpu_program_stats(),
        })
    }

    /// Whether the kernel lost process events so far (as last read): exits may not come.
    pub fn lost_proc_events(&self) -> bool {
        self.lost_events.load(Ordering::Relaxed) > 0
    }

    /// Samples lost so far (in the kernel, as last read, and in user space): for a live view.
    pub fn lost_so_far(&self) -> u64 {
        self.kernel_lost.load(Ordering::Relaxed) + self.dropped.load(Ordering::Relaxed)
    }

    fn wake_fd(&self) -> std::os::fd::RawFd {
        self.wake.as_raw_fd()
    }
}
