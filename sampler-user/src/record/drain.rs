//! The drain thread: empties the ring buffer continuously, whatever the cost of building
//! stacks, so that a slow moment in user space (first symbolization of a large library, say)
//! does not turn into samples lost in the kernel.
//!
//! Owns: the [`Collector`] for the duration of the run. Input: ring-buffer records. Output:
//! [`Drained`] items on a bounded channel. Kernel stacks are looked up here, right when the
//! sample arrives. When the channel is full the sample is dropped and counted as lost in user
//! space — never silently.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::collect::{CollectError, Collector, CounterTotals, Event, ProgramStats, RawSample};

/// Bytes of queued samples we accept before dropping (and counting) new ones.
const QUEUE_BYTES: usize = 512 << 20;
/// How often the drain thread publishes the kernel's lost-sample count for a live view.
const LOST_EVERY: Duration = Duration::from_millis(500);

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
    /// Samples taken before this kernel time (ns, `CLOCK_MONOTONIC` like `bpf_ktime_get_ns`)
    /// are not part of the run: set-up was still in progress.
    start_ns: Arc<AtomicU64>,
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
}

/// Starts draining `collector` into a bounded channel sized for `stack_bytes` per sample.
///
/// With `hold`, samples are discarded (process events are kept) until [`Drain::begin_now`].
pub fn start(mut collector: Collector, stack_bytes: u32, hold: bool) -> (Drain, Receiver<Drained>) {
    let (tx, rx) = sync_channel(queue_capacity(stack_bytes));
    let stop = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicU64::new(0));
    let kernel_lost = Arc::new(AtomicU64::new(0));
    let start_ns = Arc::new(AtomicU64::new(if hold { u64::MAX } else { 0 }));
    let shared = Shared {
        stop: stop.clone(),
        dropped: dropped.clone(),
        kernel_lost: kernel_lost.clone(),
        start_ns: start_ns.clone(),
    };
    let handle = std::thread::Builder::new()
        .name("pyebpf-drain".into())
        .spawn(move || {
            let r = run(&mut collector, &tx, &shared);
            (collector, r)
        })
        .expect("spawn drain thread");
    (
        Drain {
            stop,
            dropped,
            kernel_lost,
            start_ns,
            handle,
        },
        rx,
    )
}

/// What the drain thread shares with its handle.
struct Shared {
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    kernel_lost: Arc<AtomicU64>,
    start_ns: Arc<AtomicU64>,
}

fn run(c: &mut Collector, tx: &SyncSender<Drained>, sh: &Shared) -> Result<(), CollectError> {
    let Shared {
        stop,
        dropped,
        kernel_lost,
        start_ns,
    } = sh;
    let mut batch = Vec::new();
    let mut lost_read = Instant::now();
    loop {
        if lost_read.elapsed() >= LOST_EVERY {
            lost_read = Instant::now();
            if let Ok(totals) = c.counters() {
                kernel_lost.store(totals.lost_samples(), Ordering::Relaxed);
            }
        }
        // One last poll after the stop request drains what is already in the buffer.
        let stopping = stop.load(Ordering::Acquire);
        c.poll(
            if stopping {
                Duration::ZERO
            } else {
                Duration::from_millis(50)
            },
            |ev| batch.push(ev),
        )?;
        for ev in batch.drain(..) {
            let item = match ev {
                Event::Sample(s) if s.time_ns < start_ns.load(Ordering::Acquire) => continue,
                Event::Sample(s) => {
                    let k = (s.kernel_stack_id >= 0)
                        .then(|| c.kernel_stack(s.kernel_stack_id))
                        .flatten();
                    Drained::Sample(s, k)
                }
                other => Drained::Proc(other),
            };
            match tx.try_send(item) {
                Ok(()) => {}
                Err(TrySendError::Full(Drained::Sample(..))) => {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
                // Process events matter more than samples: wait for room.
                Err(TrySendError::Full(item)) => {
                    if tx.send(item).is_err() {
                        return Ok(());
                    }
                }
                Err(TrySendError::Disconnected(_)) => return Ok(()),
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
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into our timespec. CLOCK_MONOTONIC is the clock of
        // bpf_ktime_get_ns.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
        let now = (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64);
        self.start_ns.store(now, Ordering::Release);
    }

    /// Stops the thread after a final drain; returns the collector's counters, the user-space
    /// drop count and the program's statistics. The collector (and its channel end) is dropped.
    pub fn finish(self) -> Result<Finished, CollectError> {
        self.stop.store(true, Ordering::Release);
        let (collector, result) = self.handle.join().expect("drain thread panicked");
        result?;
        Ok(Finished {
            counters: collector.counters()?,
            dropped: self.dropped.load(Ordering::Relaxed),
            program: collector.program_stats(),
        })
    }

    /// Samples lost so far (in the kernel, as last read, and in user space): for a live view.
    pub fn lost_so_far(&self) -> u64 {
        self.kernel_lost.load(Ordering::Relaxed) + self.dropped.load(Ordering::Relaxed)
    }

    /// Whether the thread has ended (an error, or the channel closed).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}
