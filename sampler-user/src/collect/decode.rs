//! Decoding of `EVENTS` ring-buffer records into owned [`Event`]s.
//!
//! Input: one record's bytes exactly as the ring buffer hands them out (any alignment, any
//! content). Output: an [`Event`], or a [`Malformed`] reason that the collector counts.
//!
//! Record layout of a sample: `SampleEvent | stack bytes [stack_cap] | PyCapture [py_cap]`.
//!
//! Constraints: never panics and never trusts a length from the record: the stack slice is
//! bounded by `stack_cap`, by the record length and by the largest size class; the Python
//! capture by `size_of::<PyCapture>()`, the record length and `PY_MAX_FRAMES`.
use sampler_common::{
    EventHeader, OffCpuInfo, PY_MAX_FRAMES, ProcEvent, PyCapture, PyFrameRecord,
    STACK_SIZE_CLASSES, SampleEvent, UserRegs, decode, event_kind,
};

/// One event from the kernel side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A CPU-clock sample of a (target) thread, or (with `off_cpu`) an off-CPU interval.
    Sample(RawSample),
    /// A (target) process called `execve`.
    Exec(ProcChange),
    /// A (target) process's thread-group leader exited.
    Exit(ProcChange),
    /// A target process forked a child, which is now a target too.
    Fork(ProcChange),
}

/// One sample as taken in the kernel (see `sampler_common::SampleEvent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSample {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the sample.
    pub time_ns: u64,
    /// Process id (host view).
    pub pid: u32,
    /// Thread id (host view).
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Thread name, NUL-padded.
    pub comm: [u8; 16],
    /// `sampler_common::sample_flags`.
    pub flags: u32,
    /// Id for [`super::Collector::kernel_stack`], or a negative errno (`-14`: user-mode sample,
    /// `-2`: kernel stacks off).
    pub kernel_stack_id: i32,
    /// User registers at the sample (zero when `NO_USER_REGS`).
    pub regs: UserRegs,
    /// The copied user stack, when a copy was requested and at least one page was readable.
    pub stack: Option<StackCopy>,
    /// The Python frames captured in the kernel, when the process is in `PY_PROCS`
    /// (see [`super::PythonProcMap`]).
    pub python: Option<PyCaptured>,
    /// For an off-CPU interval (`--idle`): the interval; the rest of the sample is its
    /// switch-out (`time_ns` is `off_cpu.t_out`).
    pub off_cpu: Option<OffCpuInfo>,
}

/// The Python part of a sample as the kernel captured it (see `sampler_common::PyCapture`):
/// raw values, resolved by the `python` stage (`PythonProcess::resolve_frame`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyCaptured {
    /// The sampled thread's `PyThreadState` address (0 when none was found).
    pub tstate: u64,
    /// The captured frames, innermost first: exactly the valid ones (`nframes`), raw
    /// (`executable` may carry stackref tags; entry frames and shims included).
    pub frames: Vec<PyFrameRecord>,
    /// `sampler_common::py_flags`.
    pub flags: u32,
    /// The interpreter's GIL `last_holder` (a tstate address; 0 when unknown). Meaningful only
    /// when `gil_locked == 1`: the field is not cleared on release.
    pub gil_holder: u64,
    /// The GIL's `locked` word (-1: unknown).
    pub gil_locked: i32,
    /// Free-threaded builds: the GIL's `enabled` word (0: GIL disabled); -1 otherwise.
    pub gil_enabled: i32,
}

/// A copy of user stack memory: `bytes[0]` is the byte at user address `base`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackCopy {
    /// User address of the first byte (page start of the page holding `sp`).
    pub base: u64,
    /// Bytes copied upward from `base` (`len == stack_len`).
    pub bytes: Vec<u8>,
}

// `unwind` reads stacks through its `StackBytes` trait; the impl lives here until that stage
// takes `collect::StackCopy` directly (requested in the collect hand-over).
impl crate::unwind::StackBytes for StackCopy {
    fn base(&self) -> u64 {
        self.base
    }
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// A process life-cycle change (see `sampler_common::ProcEvent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcChange {
    /// `bpf_ktime_get_ns()` at the event.
    pub time_ns: u64,
    /// The process (for a fork: the child).
    pub pid: u32,
    /// For a fork: the parent process; otherwise 0.
    pub parent_pid: u32,
    /// `comm` at the event (after exec: the new name).
    pub comm: [u8; 16],
}

/// Why a record could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than its header or its fixed part.
    TooShort {
        /// Record length.
        len: usize,
    },
    /// `header.kind` is not one of `sampler_common::event_kind`.
    UnknownKind {
        /// The kind found.
        kind: u32,
    },
    /// `stack_len > stack_cap`, a capacity that is no size class, or a record shorter than the
    /// stack it declares.
    BadStack {
        /// Declared valid bytes.
        len: u32,
        /// Declared capacity.
        cap: u32,
    },
    /// `py_cap` is neither 0 nor `size_of::<PyCapture>()`, the record is shorter than the
    /// capture it declares, or `nframes > PY_MAX_FRAMES`.
    BadPython {
        /// Declared capture size.
        cap: u32,
        /// Declared frame count (0 when the capture itself could not be read).
        nframes: u32,
    },
}

const SAMPLE_SIZE: usize = size_of::<SampleEvent>();
const OFF_CPU_SIZE: usize = size_of::<OffCpuInfo>();
const PY_CAPTURE_SIZE: usize = size_of::<PyCapture>();
const PY_FRAMES_OFFSET: usize = std::mem::offset_of!(PyCapture, frames);
const PY_FRAME_SIZE: usize = size_of::<PyFrameRecord>();

/// Decode one ring-buffer record.
pub fn decode_record(bytes: &[u8]) -> Result<Event, Malformed> {
    let too_short = Malformed::TooShort { len: bytes.len() };
    let header = decode::<EventHeader>(bytes).ok_or(too_short)?;
    match header.kind {
        event_kind::SAMPLE => decode_sample(bytes, None).map(Event::Sample),
        event_kind::OFFCPU => {
            let off = decode::<OffCpuInfo>(bytes.get(SAMPLE_SIZE..).unwrap_or_default())
                .ok_or(too_short)?;
            decode_sample(bytes, Some(off)).map(Event::Sample)
        }
        event_kind::EXEC => decode_proc(bytes).map(Event::Exec),
        event_kind::EXIT => decode_proc(bytes).map(Event::Exit),
        event_kind::FORK => decode_proc(bytes).map(Event::Fork),
        kind => Err(Malformed::UnknownKind { kind }),
    }
}

/// A sample record, or with `off` an off-CPU record (whose stack and capture follow the
/// `OffCpuInfo`).
pub(super) fn decode_sample(bytes: &[u8], off: Option<OffCpuInfo>) -> Result<RawSample, Malformed> {
    let ev = decode::<SampleEvent>(bytes).ok_or(Malformed::TooShort { len: bytes.len() })?;
    // From here on `bytes` starts `OFF_CPU_SIZE` later for an off-CPU record: the stack and
    // the capture then sit at the offsets a sample has them (`ev` is already decoded).
    let skip = if off.is_some() { OFF_CPU_SIZE } else { 0 };
    let len = bytes.len();
    let bytes = bytes
        .get(skip..)
        .filter(|b| b.len() >= SAMPLE_SIZE)
        .ok_or(Malformed::TooShort { len })?;
    let stack = if ev.stack_cap == 0 {
        if ev.stack_len != 0 {
            return Err(Malformed::BadStack {
                len: ev.stack_len,
                cap: 0,
            });
        }
        None
    } else {
        let bad = Malformed::BadStack {
            len: ev.stack_len,
            cap: ev.stack_cap,
        };
        if ev.stack_len > ev.stack_cap || !STACK_SIZE_CLASSES.contains(&ev.stack_cap) {
            return Err(bad);
        }
        let tail = &bytes[SAMPLE_SIZE..];
        if tail.len() < ev.stack_cap as usize {
            return Err(bad);
        }
        (ev.stack_len > 0).then(|| StackCopy {
            base: ev.stack_base,
            bytes: tail[..ev.stack_len as usize].to_vec(),
        })
    };
    // `stack_cap` is 0 or a size class here, and the record holds at least that many bytes.
    // An off-CPU record ends after its last captured frame.
    let python = decode_python(
        &bytes[SAMPLE_SIZE + ev.stack_cap as usize..],
        ev.py_cap,
        off.is_some(),
    )?;
    Ok(RawSample {
        time_ns: ev.time_ns,
        pid: ev.pid,
        tid: ev.tid,
        cpu: ev.cpu,
        comm: ev.comm,
        flags: ev.header.flags,
        kernel_stack_id: ev.kernel_stack_id,
        regs: ev.regs,
        stack,
        python,
        off_cpu: off,
    })
}

/// The `PyCapture` at the start of `tail` when `py_cap` declares one; with `cut`, `tail` may
/// end right after the capture's last valid frame (an off-CPU record).
fn decode_python(tail: &[u8], py_cap: u32, cut: bool) -> Result<Option<PyCaptured>, Malformed> {
    if py_cap == 0 {
        return Ok(None);
    }
    let bad = |nframes| Malformed::BadPython {
        cap: py_cap,
        nframes,
    };
    if py_cap as usize != PY_CAPTURE_SIZE {
        return Err(bad(0));
    }
    let cap = if cut {
        // The fixed part, then as many frames as the record holds (checked below).
        let mut whole = vec![0u8; PY_CAPTURE_SIZE];
        let have = tail.len().min(PY_CAPTURE_SIZE);
        if have < PY_FRAMES_OFFSET {
            return Err(bad(0));
        }
        whole[..have].copy_from_slice(&tail[..have]);
        decode::<PyCapture>(&whole).ok_or(bad(0))?
    } else {
        decode::<PyCapture>(tail).ok_or(bad(0))?
    };
    let n = cap.nframes as usize;
    if n > PY_MAX_FRAMES || tail.len() < PY_FRAMES_OFFSET + n * PY_FRAME_SIZE {
        return Err(bad(cap.nframes));
    }
    let frames = tail[PY_FRAMES_OFFSET..PY_FRAMES_OFFSET + n * PY_FRAME_SIZE]
        .chunks_exact(PY_FRAME_SIZE)
        .filter_map(decode::<PyFrameRecord>)
        .collect();
    Ok(Some(PyCaptured {
        tstate: cap.tstate,
        frames,
        flags: cap.flags,
        gil_holder: cap.gil_holder,
        gil_locked: cap.gil_locked,
        gil_enabled: cap.gil_enabled,
    }))
}

fn decode_proc(bytes: &[u8]) -> Result<ProcChange, Malformed> {
    let ev = decode::<ProcEvent>(bytes).ok_or(Malformed::TooShort { len: bytes.len() })?;
    Ok(ProcChange {
        time_ns: ev.time_ns,
        pid: ev.pid,
        parent_pid: ev.parent_pid,
        comm: ev.comm,
    })
}

#[cfg(test)]
mod tests {
    use sampler_common::{encode, sample_flags};

    use super::*;

    fn sample(stack_len: u32, stack_cap: u32) -> SampleEvent {
        SampleEvent {
            header: EventHeader {
                kind: event_kind::SAMPLE,
                flags: sample_flags::USER_MODE,
            },
            time_ns: 42,
            pid: 100,
            tid: 101,
            cpu: 1,
            kernel_stack_id: -14,
            regs: UserRegs {
                ip: 0x40_1000,
                sp: 0x7ffd_0000_1f00,
                bp: 0,
            },
            stack_base: 0x7ffd_0000_1000,
            stack_len,
            stack_cap,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
            py_cap: 0,
            _pad: 0,
        }
    }

    fn record(ev: &SampleEvent, stack: &[u8]) -> Vec<u8> {
        let mut v = encode(ev).to_vec();
        v.extend_from_slice(stack);
        v
    }

    #[test]
    fn sample_without_stack() {
        let ev = sample(0, 0);
        let Event::Sample(s) = decode_record(encode(&ev)).unwrap() else {
            panic!("not a sample")
        };
        assert_eq!((s.pid, s.tid, s.cpu, s.time_ns), (100, 101, 1, 42));
        assert_eq!(s.flags, sample_flags::USER_MODE);
        assert_eq!(s.kernel_stack_id, -14);
        assert_eq!(s.regs.ip, 0x40_1000);
        assert_eq!(&s.comm[..7], b"python3");
        assert_eq!(s.stack, None);
    }

    #[test]
    fn sample_with_stack_keeps_only_stack_len_bytes() {
        let cap = STACK_SIZE_CLASSES[0];
        let mut stack = vec![0xAA; cap as usize];
        stack[..4096].fill(0x11);
        let bytes = record(&sample(4096, cap), &stack);
        let Event::Sample(s) = decode_record(&bytes).unwrap() else {
            panic!("not a sample")
        };
        let copy = s.stack.unwrap();
        assert_eq!(copy.base, 0x7ffd_0000_1000);
        assert_eq!(copy.bytes.len(), 4096);
        assert!(copy.bytes.iter().all(|&b| b == 0x11));
    }

    #[test]
    fn empty_copy_is_none() {
        let cap = STACK_SIZE_CLASSES[1];
        let bytes = record(&sample(0, cap), &vec![0; cap as usize]);
        let Event::Sample(s) = decode_record(&bytes).unwrap() else {
            panic!("not a sample")
        };
        assert_eq!(s.stack, None);
    }

    #[test]
    fn stack_len_over_cap_is_malformed() {
        let cap = STACK_SIZE_CLASSES[0];
        let bytes = record(&sample(cap + 4096, cap), &vec![0; cap as usize]);
        assert_eq!(
            decode_record(&bytes),
            Err(Malformed::BadStack {
                len: cap + 4096,
                cap
            })
        );
    }

    #[test]
    fn record_shorter_than_declared_stack_is_malformed() {
        let cap = STACK_SIZE_CLASSES[0];
        let bytes = record(&sample(4096, cap), &[0; 4096]);
        assert!(matches!(
            decode_record(&bytes),
            Err(Malformed::BadStack { .. })
        ));
    }

    #[test]
    fn odd_capacity_is_malformed() {
        let bytes = record(&sample(10, 100), &[0; 100]);
        assert!(matches!(
            decode_record(&bytes),
            Err(Malformed::BadStack { .. })
        ));
        let bytes = record(&sample(10, 0), &[]);
        assert!(matches!(
            decode_record(&bytes),
            Err(Malformed::BadStack { .. })
        ));
    }

    #[test]
    fn short_and_unknown_records_are_malformed() {
        assert_eq!(decode_record(&[]), Err(Malformed::TooShort { len: 0 }));
        assert_eq!(
            decode_record(&[1, 0, 0]),
            Err(Malformed::TooShort { len: 3 })
        );
        let ev = sample(0, 0);
        assert_eq!(
            decode_record(&encode(&ev)[..50]),
            Err(Malformed::TooShort { len: 50 })
        );
        let header = EventHeader { kind: 99, flags: 0 };
        assert_eq!(
            decode_record(encode(&header)),
            Err(Malformed::UnknownKind { kind: 99 })
        );
        let proc = ProcEvent {
            header: EventHeader {
                kind: event_kind::EXIT,
                flags: 0,
            },
            ..ProcEvent::default()
        };
        assert_eq!(
            decode_record(&encode(&proc)[..20]),
            Err(Malformed::TooShort { len: 20 })
        );
    }

    #[test]
    fn proc_events_decode_by_kind() {
        for (kind, want) in [
            (event_kind::EXEC, 0),
            (event_kind::EXIT, 1),
            (event_kind::FORK, 2),
        ] {
            let ev = ProcEvent {
                header: EventHeader { kind, flags: 0 },
                time_ns: 7,
                pid: 10,
                parent_pid: 9,
                comm: [b'p'; 16],
            };
            let got = decode_record(encode(&ev)).unwrap();
            let (idx, change) = match got {
                Event::Exec(c) => (0, c),
                Event::Exit(c) => (1, c),
                Event::Fork(c) => (2, c),
                Event::Sample(_) => panic!("sample"),
            };
            assert_eq!(idx, want);
            assert_eq!(
                change,
                ProcChange {
                    time_ns: 7,
                    pid: 10,
                    parent_pid: 9,
                    comm: [b'p'; 16]
                }
            );
        }
    }

    /// A capture with `nframes` declared and frames `i` = (`0x1000 + i`, `0x2000 + i`, …).
    fn capture(nframes: u32, flags: u32) -> PyCapture {
        let mut cap = PyCapture {
            tstate: 0x7f00_0000_1000,
            gil_holder: 0x7f00_0000_1000,
            gil_locked: 1,
            gil_enabled: -1,
            nframes,
            flags,
            frames: [PyFrameRecord::default(); PY_MAX_FRAMES],
        };
        for (i, f) in cap.frames.iter_mut().enumerate() {
            *f = PyFrameRecord {
                executable: 0x1000 + i as u64,
                instr_ptr: 0x2000 + i as u64,
                name: 0x3000 + i as u64,
                filename: 0x4000 + i as u64,
                globals: 0x5000 + i as u64,
                tlbc_index: i as i32,
                owner: (i % 4) as u8,
                is_entry: (i % 2) as u8,
                first_line: i as u16,
            };
        }
        cap
    }

    fn py_record(stack_cap: u32, cap: &PyCapture) -> Vec<u8> {
        let mut ev = sample(stack_cap.min(4096), stack_cap);
        ev.py_cap = PY_CAPTURE_SIZE as u32;
        let mut v = record(&ev, &vec![0x11; stack_cap as usize]);
        v.extend_from_slice(encode(cap));
        v
    }

    fn python_of(bytes: &[u8]) -> PyCaptured {
        let Event::Sample(s) = decode_record(bytes).unwrap() else {
            panic!("not a sample")
        };
        s.python.expect("no python capture")
    }

    #[test]
    fn python_capture_without_and_after_a_stack() {
        use sampler_common::py_flags;
        let flags = py_flags::CAPTURED | py_flags::CACHE_HIT;
        for stack_cap in [0].into_iter().chain(STACK_SIZE_CLASSES) {
            let py = python_of(&py_record(stack_cap, &capture(20, flags)));
            assert_eq!(py.frames.len(), 20, "stack {stack_cap}");
            assert_eq!(py.flags, flags);
            assert_eq!(py.tstate, 0x7f00_0000_1000);
            assert_eq!(
                (py.gil_holder, py.gil_locked, py.gil_enabled),
                (0x7f00_0000_1000, 1, -1)
            );
            for (i, f) in py.frames.iter().enumerate() {
                assert_eq!(f.executable, 0x1000 + i as u64);
                assert_eq!(f.instr_ptr, 0x2000 + i as u64);
                assert_eq!(f.tlbc_index, i as i32);
                assert_eq!(f.owner, (i % 4) as u8);
            }
        }
        // Zero frames (a thread with no Python frames) and the full budget.
        assert!(
            python_of(&py_record(0, &capture(0, flags)))
                .frames
                .is_empty()
        );
        let full = python_of(&py_record(0, &capture(PY_MAX_FRAMES as u32, flags)));
        assert_eq!(full.frames.len(), PY_MAX_FRAMES);
        assert_eq!(full.frames[PY_MAX_FRAMES - 1].executable, 0x1000 + 255);
    }

    #[test]
    fn sample_without_python_has_none() {
        let Event::Sample(s) = decode_record(encode(&sample(0, 0))).unwrap() else {
            panic!("not a sample")
        };
        assert_eq!(s.python, None);
    }

    #[test]
    fn truncated_python_record_is_malformed() {
        for stack_cap in [0, STACK_SIZE_CLASSES[0]] {
            let bytes = py_record(stack_cap, &capture(3, 0));
            for cut in [1, 8, PY_CAPTURE_SIZE - 1, PY_CAPTURE_SIZE] {
                assert_eq!(
                    decode_record(&bytes[..bytes.len() - cut]),
                    Err(Malformed::BadPython {
                        cap: PY_CAPTURE_SIZE as u32,
                        nframes: 0
                    }),
                    "stack {stack_cap}, cut {cut}"
                );
            }
        }
    }

    #[test]
    fn too_many_python_frames_is_malformed() {
        for n in [PY_MAX_FRAMES as u32 + 1, u32::MAX] {
            assert_eq!(
                decode_record(&py_record(0, &capture(n, 0))),
                Err(Malformed::BadPython {
                    cap: PY_CAPTURE_SIZE as u32,
                    nframes: n
                })
            );
        }
    }

    #[test]
    fn odd_python_capture_size_is_malformed() {
        let mut bytes = py_record(0, &capture(1, 0));
        let off = std::mem::offset_of!(SampleEvent, py_cap);
        for cap in [
            1u32,
            PY_CAPTURE_SIZE as u32 - 24,
            PY_CAPTURE_SIZE as u32 + 24,
        ] {
            bytes[off..off + 4].copy_from_slice(&cap.to_le_bytes());
            assert_eq!(
                decode_record(&bytes),
                Err(Malformed::BadPython { cap, nframes: 0 })
            );
        }
    }

    #[test]
    fn offcpu_record_decodes_with_its_interval_and_capture() {
        use sampler_common::{OffCpuRecord, offcpu_flags, py_flags};
        let mut ev = sample(0, 0);
        ev.header.kind = event_kind::OFFCPU;
        ev.py_cap = PY_CAPTURE_SIZE as u32;
        let off = OffCpuInfo {
            t_out: 10,
            t_wake: 20,
            t_in: 30,
            syscall: 230,
            task_state: 1,
            flags: offcpu_flags::IN_SYSCALL,
        };
        let rec = OffCpuRecord {
            event: ev,
            off,
            py: capture(4, py_flags::CAPTURED),
        };
        let whole = encode(&rec);
        // As the kernel sends it: cut after the last captured frame.
        let bytes = &whole[..96 + 40 + PY_FRAMES_OFFSET + 4 * PY_FRAME_SIZE];
        let Event::Sample(s) = decode_record(whole).unwrap() else {
            panic!("not a sample")
        };
        assert_eq!(s.python.unwrap().frames.len(), 4);
        let Event::Sample(s) = decode_record(bytes).unwrap() else {
            panic!("not a sample")
        };
        assert_eq!(s.off_cpu, Some(off));
        assert_eq!((s.pid, s.tid, s.time_ns), (100, 101, 42));
        let py = s.python.unwrap();
        assert_eq!(py.frames.len(), 4);
        assert_eq!(py.frames[3].executable, 0x1003);
        // Cut anywhere: an error, never a panic.
        for cut in 0..bytes.len() {
            assert!(decode_record(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn garbage_never_panics() {
        // A cheap deterministic fuzz: every prefix of records with random-ish contents.
        let mut state = 0x1234_5678_u32;
        let mut buf = vec![0u8; 200];
        for round in 0..2000 {
            for b in &mut buf {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                *b = state as u8;
            }
            buf[0] = (round % 6) as u8;
            buf[1..4].fill(0);
            let _ = decode_record(&buf[..round % buf.len()]);
        }
        // Python-bearing records with random captures, cut anywhere.
        let mut bytes = py_record(0, &capture(3, 0));
        let base = SAMPLE_SIZE;
        for round in 0..2000usize {
            for b in &mut bytes[base..base + 32] {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                *b = state as u8;
            }
            let cut = (state as usize) % (bytes.len() + 1);
            let _ = decode_record(&bytes[..cut.max(round % 4)]);
            let _ = decode_record(&bytes);
        }
    }
}
