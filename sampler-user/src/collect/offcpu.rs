//! The one user-space owner of the `OFFCPU` map (`record --idle`): seeding it for threads that
//! are already off a CPU when their process is first seen, and reading the intervals still open
//! at the end of a run.
//!
//! Input: seeds (a thread asleep now: its pid, tid and task state); the end time of the run.
//! Output: map inserts, and at the end the open intervals as [`RawSample`]s (closed at the end
//! time), exactly as the kernel would have sent them at a switch-in.
//! Handed out once by [`super::Collector::take_offcpu`] so that the thread that attaches to
//! Python processes can seed while the collector drains on another thread; it keeps the map
//! alive after the collector (and its programs) are dropped, which is when the open intervals
//! are read: nothing writes the map any more then.
//!
//! Constraints: a seed never replaces an entry the kernel wrote (`BPF_NOEXIST`); a full map is
//! counted, never fatal.
use aya::maps::{HashMap, MapData, MapError, StackTraceMap};
use sampler_common::{
    EventHeader, OffCpuInfo, OffCpuRecord, PyCapture, SampleEvent, event_kind, offcpu_flags,
    sample_flags,
};

use super::decode::{RawSample, decode_sample};

/// `BPF_NOEXIST`: insert only when the key is absent.
const NOEXIST: u64 = 1;

/// Typed handle on `OFFCPU` (`u32` host tid → [`OffCpuRecord`]).
pub struct OffCpuMap {
    map: HashMap<MapData, u32, OffCpuRecord>,
    period_ns: u64,
    /// A second handle on `KSTACKS` (`--kernel`): the kernel stacks of the intervals still
    /// open at the end are read after the collector is gone.
    kstacks: Option<StackTraceMap<MapData>>,
}

/// A thread to seed: off a CPU when first seen, with the state `/proc` gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seed {
    /// Host pid.
    pub pid: u32,
    /// Host tid.
    pub tid: u32,
    /// The task state word equivalent of `/proc`'s state letter (1 `S`, 2 `D`).
    pub task_state: u32,
    /// The thread's name (comm), NUL-padded.
    pub comm: [u8; 16],
}

impl OffCpuMap {
    pub(crate) fn new(
        map: HashMap<MapData, u32, OffCpuRecord>,
        period_ns: u64,
        kstacks: Option<StackTraceMap<MapData>>,
    ) -> OffCpuMap {
        OffCpuMap {
            map,
            period_ns,
            kstacks,
        }
    }

    /// The off-CPU sampling period (ns).
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// Opens an interval at `now_ns` for a thread that is off a CPU now, unless the kernel
    /// already follows it. `Ok(false)`: it does; an error: the map is full or unusable.
    pub fn seed(&mut self, seed: &Seed, now_ns: u64) -> Result<bool, MapError> {
        let event = SampleEvent {
            header: EventHeader {
                kind: event_kind::OFFCPU,
                flags: sample_flags::NO_USER_REGS,
            },
            time_ns: now_ns,
            pid: seed.pid,
            tid: seed.tid,
            cpu: 0,
            kernel_stack_id: -2,
            regs: sampler_common::UserRegs::default(),
            stack_base: 0,
            stack_len: 0,
            stack_cap: 0,
            comm: seed.comm,
            py_cap: 0,
            _pad: 0,
        };
        let rec = OffCpuRecord {
            event,
            off: OffCpuInfo {
                t_out: now_ns,
                t_wake: 0,
                t_in: 0,
                syscall: 0,
                task_state: seed.task_state,
                flags: offcpu_flags::SEEDED,
            },
            py: empty_capture(),
        };
        match self.map.insert(seed.tid, rec, NOEXIST) {
            Ok(()) => Ok(true),
            Err(e) if super::error::errno_of(&e) == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The intervals still open, closed at `end_ns`, as the kernel would send them (those
    /// without a sampling instant left out), each with its kernel stack (innermost first) when
    /// one was recorded. Read once, when the programs are detached.
    pub fn open_intervals(&self, end_ns: u64) -> Vec<(RawSample, Option<Vec<u64>>)> {
        let mut out = Vec::new();
        for item in &self.map {
            let Ok((_, mut rec)) = item else { continue };
            if rec.off.t_out == 0 || end_ns / self.period_ns <= rec.off.t_out / self.period_ns {
                continue;
            }
            rec.off.t_in = end_ns;
            if let Ok(s) = decode_sample(sampler_common::encode(&rec), Some(rec.off)) {
                let kernel = self.kernel_stack(s.kernel_stack_id);
                out.push((s, kernel));
            }
        }
        out
    }
}

impl OffCpuMap {
    fn kernel_stack(&self, id: i32) -> Option<Vec<u64>> {
        let trace = self
            .kstacks
            .as_ref()?
            .get(&u32::try_from(id).ok()?, 0)
            .ok()?;
        let frames: Vec<u64> = trace.frames().iter().map(|f| f.ip).collect();
        (!frames.is_empty()).then_some(frames)
    }
}

fn empty_capture() -> PyCapture {
    PyCapture {
        tstate: 0,
        gil_holder: 0,
        gil_locked: -1,
        gil_enabled: -1,
        nframes: 0,
        flags: 0,
        frames: [sampler_common::PyFrameRecord::default(); sampler_common::PY_MAX_FRAMES],
    }
}
