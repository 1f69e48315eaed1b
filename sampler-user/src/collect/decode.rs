//! Decoding of `EVENTS` ring-buffer records into owned [`Event`]s.
//!
//! Input: one record's bytes exactly as the ring buffer hands them out (any alignment, any
//! content). Output: an [`Event`], or a [`Malformed`] reason that the collector counts.
//!
//! Constraints: never panics and never trusts a length from the record: the stack slice is
//! bounded by `stack_cap`, by the record length and by the largest size class.
use sampler_common::{
    EventHeader, ProcEvent, STACK_SIZE_CLASSES, SampleEvent, UserRegs, decode, event_kind,
};

/// One event from the kernel side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A CPU-clock sample of a (target) thread.
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
}

const SAMPLE_SIZE: usize = size_of::<SampleEvent>();

/// Decode one ring-buffer record.
pub fn decode_record(bytes: &[u8]) -> Result<Event, Malformed> {
    let too_short = Malformed::TooShort { len: bytes.len() };
    let header = decode::<EventHeader>(bytes).ok_or(too_short)?;
    match header.kind {
        event_kind::SAMPLE => decode_sample(bytes).map(Event::Sample),
        event_kind::EXEC => decode_proc(bytes).map(Event::Exec),
        event_kind::EXIT => decode_proc(bytes).map(Event::Exit),
        event_kind::FORK => decode_proc(bytes).map(Event::Fork),
        kind => Err(Malformed::UnknownKind { kind }),
    }
}

fn decode_sample(bytes: &[u8]) -> Result<RawSample, Malformed> {
    let ev = decode::<SampleEvent>(bytes).ok_or(Malformed::TooShort { len: bytes.len() })?;
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
    })
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
    }
}
