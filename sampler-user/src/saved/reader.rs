//! Reading the saved format: chunks (version 2) or the single message of version 1, into a
//! [`Profile`], within limits that keep a crafted file from costing more than its size.
//!
//! Every count and size is checked before it is allocated or rendered: a chunk against
//! [`MAX_CHUNK`] and against what is left of the file, the decompressed total against
//! [`MAX_PAYLOAD`], each string against [`MAX_STRING`], each stack against
//! [`MAX_STACK_DEPTH`], and the work a renderer will do against the bytes read so far: samples
//! ([`SAMPLES_PER_BYTE`]), frames over all samples (what `script` and speedscope print,
//! [`FRAME_REFS_PER_BYTE`]) and the text of the unique stacks (what the flame graph and the
//! folded stacks print, [`TEXT_PER_BYTE`]). An honest recording stays far below each ratio
//! (about 7 bytes per sample, stacks of at most a few hundred frames), a decompression bomb or a
//! file that repeats one deep stack millions of times does not.

use std::io::{self, Read};
use std::sync::Arc;

use prost::Message as _;

use super::{
    ChunkKind, FORMAT_VERSION, FormatError, MAGIC, gil_from_wire, kind_from_wire, schema,
    state_from_wire,
};
use crate::failure::{Failure, Failures};
use crate::profile::{
    FileNames, Frame, FrameId, FrameKind, NameId, Profile, RunMeta, Sample, SampleKey, StackId,
    ThreadState,
};

/// Largest chunk body (compressed), and largest decompressed chunk (a one-second batch of
/// 10 kHz on 64 CPUs is about 10 MiB).
pub const MAX_CHUNK: u64 = 64 << 20;
/// Largest decompressed total (1 GiB, about 70 million samples).
pub const MAX_PAYLOAD: u64 = 1 << 30;
/// Longest string (names are at most a few KiB).
pub const MAX_STRING: usize = 64 << 10;
/// Deepest stack (`record` makes at most 256 Python + 256 native + 127 kernel frames and a few
/// markers).
pub const MAX_STACK_DEPTH: usize = 1024;
/// Samples per byte of file, plus [`SLACK`] (an honest file spends several bytes per sample).
pub const SAMPLES_PER_BYTE: u64 = 16;
/// Frames over all samples, per byte of file, plus 4 × [`SLACK`].
pub const FRAME_REFS_PER_BYTE: u64 = 1024;
/// Bytes of frame text over all unique stacks, per byte of file, plus 64 × [`SLACK`].
pub const TEXT_PER_BYTE: u64 = 4096;
/// What any file may use before the per-byte ratios apply.
pub const SLACK: u64 = 1 << 20;

/// How a load ended.
#[derive(Debug)]
pub struct Loaded {
    /// The profile.
    pub profile: Profile,
    /// `false` when the file has no end chunk (the run was killed or is still writing): the
    /// profile holds the samples up to its last complete chunk; duration, lost samples and
    /// errors are not known.
    pub complete: bool,
}

/// Reads bytes and counts them.
struct Counting<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Reads until `buf` is full or the stream ends; the number of bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, FormatError> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FormatError::Read(e)),
        }
    }
    Ok(n)
}

fn corrupt(s: impl Into<String>) -> FormatError {
    FormatError::Corrupt(s.into())
}

/// Reads a saved profile from a stream (its samples counted by key, the timeline not kept).
pub fn load_from(reader: impl Read) -> Result<Loaded, FormatError> {
    load_from_with(reader, false)
}

/// Reads a saved profile from a stream; with `timeline` the profile also keeps every sample in
/// order ([`Profile::timeline`]: `script`, or writing the saved format again).
pub fn load_from_with(reader: impl Read, timeline: bool) -> Result<Loaded, FormatError> {
    let mut r = Counting {
        inner: io::BufReader::new(reader),
        read: 0,
    };
    let version = read_header(&mut r)?;
    let mut b = Builder {
        version,
        ..Builder::default()
    };
    if timeline {
        b.profile.keep_timeline();
    }
    if version == 1 {
        // One gzip member holding one message with everything.
        let mut file = Vec::new();
        (&mut r)
            .take(MAX_PAYLOAD + 1)
            .read_to_end(&mut file)
            .map_err(FormatError::Read)?;
        let mut rest = &file[..];
        let payload = decompress(&mut rest, MAX_PAYLOAD)?;
        if !rest.is_empty() {
            return Err(corrupt("data after the end of the compressed profile"));
        }
        let msg = decode_message(&payload)?;
        b.start(&msg)?;
        b.batch(msg.strings, &msg.frames, msg.stacks, msg.samples, r.read)?;
        b.end(msg.meta, None)?;
        return b.finish();
    }
    let mut payload_total = 0u64;
    loop {
        let mut head = [0u8; 5];
        let n = read_full(&mut r, &mut head)?;
        if n == 0 {
            break;
        }
        if b.ended {
            return Err(corrupt("data after the end chunk"));
        }
        if n < head.len() {
            b.cut = true;
            break;
        }
        let kind = ChunkKind::from_byte(head[0])
            .ok_or_else(|| corrupt(format!("unknown chunk kind {}", head[0])))?;
        let len = u64::from(u32::from_le_bytes([head[1], head[2], head[3], head[4]]));
        if len > MAX_CHUNK {
            return Err(corrupt(format!("a chunk of {len} bytes")));
        }
        // Read through a bounded reader: a declared length beyond the end of the file costs
        // only what the file holds.
        let mut body = Vec::new();
        (&mut r)
            .take(len)
            .read_to_end(&mut body)
            .map_err(FormatError::Read)?;
        if (body.len() as u64) < len {
            // Cut inside this chunk: the run was killed while writing it.
            b.cut = true;
            break;
        }
        let mut rest = &body[..];
        let payload = decompress(&mut rest, MAX_CHUNK)?;
        if !rest.is_empty() {
            return Err(corrupt("data after the compressed message of a chunk"));
        }
        payload_total += payload.len() as u64;
        if payload_total > MAX_PAYLOAD {
            return Err(corrupt(format!(
                "more than {} MiB uncompressed",
                MAX_PAYLOAD >> 20
            )));
        }
        let msg = decode_message(&payload)?;
        match kind {
            ChunkKind::Start => b.start(&msg)?,
            ChunkKind::Batch => {
                b.batch(msg.strings, &msg.frames, msg.stacks, msg.samples, r.read)?;
            }
            ChunkKind::End => b.end(msg.meta, msg.sample_count)?,
        }
    }
    b.finish()
}

/// Reads and checks the magic and the format version.
fn read_header(r: &mut impl Read) -> Result<u32, FormatError> {
    let mut header = [0u8; 12];
    let n = read_full(r, &mut header)?;
    if n == 0 {
        return Err(corrupt("empty file"));
    }
    let magic_len = n.min(MAGIC.len());
    if header[..magic_len] != MAGIC[..magic_len] {
        return Err(FormatError::BadMagic);
    }
    if n < header.len() {
        return Err(corrupt(format!(
            "{n}-byte file, shorter than the 12-byte header"
        )));
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version > FORMAT_VERSION {
        return Err(FormatError::Newer { version });
    }
    if version == 0 {
        return Err(corrupt("format version 0"));
    }
    Ok(version)
}

/// Decompresses one gzip member from `r`, up to `max` bytes.
pub(super) fn decompress(r: &mut &[u8], max: u64) -> Result<Vec<u8>, FormatError> {
    let corrupt_or_read = |e: io::Error| match e.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput | io::ErrorKind::UnexpectedEof => {
            corrupt(format!("compressed data: {e}"))
        }
        _ => FormatError::Read(e),
    };
    let mut limited = flate2::bufread::GzDecoder::new(r).take(max + 1);
    let mut payload = Vec::new();
    limited.read_to_end(&mut payload).map_err(corrupt_or_read)?;
    if payload.len() as u64 > max {
        return Err(corrupt(format!("more than {} MiB uncompressed", max >> 20)));
    }
    if payload.is_empty() {
        return Err(corrupt("no profile after the header"));
    }
    Ok(payload)
}

fn decode_message(payload: &[u8]) -> Result<schema::SavedProfile, FormatError> {
    schema::SavedProfile::decode(payload).map_err(|e| corrupt(format!("bad message: {e}")))
}

/// The profile being read, chunk by chunk; every index is checked against what came before.
#[derive(Default)]
struct Builder {
    /// The file's format version.
    version: u32,
    started: bool,
    ended: bool,
    /// The file ends inside a chunk.
    cut: bool,
    profile: Profile,
    strings: Vec<Arc<str>>,
    /// The profile's name of each string, once a sample used it.
    names: Vec<Option<NameId>>,
    /// Text bytes of each frame (what a folded line spends on it).
    frame_text: Vec<u64>,
    samples: u64,
    frame_refs: u64,
    stack_text: u64,
    /// Earliest and latest sample time.
    span: Option<(u64, u64)>,
}

impl Builder {
    fn start(&mut self, msg: &schema::SavedProfile) -> Result<(), FormatError> {
        if self.started {
            return Err(corrupt("two start chunks"));
        }
        if msg.writer.is_empty() {
            return Err(corrupt("no writer name"));
        }
        self.profile.meta =
            decode_meta(msg.meta.clone().ok_or_else(|| corrupt("no run metadata"))?)?;
        self.started = true;
        Ok(())
    }

    fn string(&self, i: u32, what: &dyn Fn() -> String) -> Result<Arc<str>, FormatError> {
        self.strings.get(i as usize).cloned().ok_or_else(|| {
            corrupt(format!(
                "{} names string {i}, but there are {} strings",
                what(),
                self.strings.len()
            ))
        })
    }

    /// The profile's name for string `i` (a comm or thread name).
    fn name(&mut self, i: u32, what: &dyn Fn() -> String) -> Result<NameId, FormatError> {
        if let Some(Some(id)) = self.names.get(i as usize) {
            return Ok(*id);
        }
        let s = self.string(i, what)?;
        let id = self.profile.intern_name(&s);
        self.names[i as usize] = Some(id);
        Ok(id)
    }

    /// Adds one batch; `read` is the number of file bytes read so far (the limits' base).
    fn batch(
        &mut self,
        strings: Vec<String>,
        frames: &[schema::Frame],
        stacks: Vec<schema::Stack>,
        samples: Option<schema::Samples>,
        read: u64,
    ) -> Result<(), FormatError> {
        if !self.started || self.ended {
            return Err(corrupt("samples outside the start and end chunks"));
        }
        for s in strings {
            if s.len() > MAX_STRING {
                return Err(corrupt(format!("a string of {} bytes", s.len())));
            }
            self.strings.push(Arc::from(s));
            self.names.push(None);
        }
        for f in frames {
            self.frame(f)?;
        }
        for s in stacks {
            self.stack(s)?;
        }
        let cols = samples.ok_or_else(|| corrupt("no samples"))?;
        // The cost is checked before the samples are built: a crafted batch is refused
        // without building its samples.
        let mut refs = 0u64;
        for &stack in &cols.stack {
            refs += self.profile.stack_len(StackId(stack)).unwrap_or(0) as u64;
        }
        self.check_cost(read, cols.stack.len() as u64, refs)?;
        self.samples(&cols)
    }

    fn frame(&mut self, f: &schema::Frame) -> Result<(), FormatError> {
        let i = self.profile.frames().len();
        let what = || format!("frame {i}");
        let kind = schema::FrameKind::try_from(f.kind)
            .ok()
            .and_then(kind_from_wire)
            .ok_or_else(|| corrupt(format!("frame {i} has unknown kind {}", f.kind)))?;
        if kind == FrameKind::State && self.version < 3 {
            return Err(corrupt(format!(
                "frame {i} is a thread state in a version {} file",
                self.version
            )));
        }
        let frame = Frame {
            kind,
            name: self.string(f.name, &what)?,
            module: f.module.map(|m| self.string(m, &what)).transpose()?,
            file: f.file.map(|m| self.string(m, &what)).transpose()?,
            short_file: f.short_file.map(|m| self.string(m, &what)).transpose()?,
            line: f.line,
        };
        let text = frame.name.len()
            + frame.module.as_ref().map_or(0, |m| m.len())
            + frame.display_file(FileNames::Full).map_or(0, str::len)
            + 16;
        self.frame_text.push(text as u64);
        self.profile
            .push_frame(frame)
            .map_err(|e| corrupt(e.to_string()))?;
        Ok(())
    }

    fn stack(&mut self, s: schema::Stack) -> Result<(), FormatError> {
        let i = self.profile.stack_count();
        if s.frames.len() > MAX_STACK_DEPTH {
            return Err(corrupt(format!(
                "stack {i} is {} frames deep (at most {MAX_STACK_DEPTH})",
                s.frames.len()
            )));
        }
        let mut text = 0u64;
        for &f in &s.frames {
            text += self.frame_text.get(f as usize).copied().ok_or_else(|| {
                corrupt(format!(
                    "stack {i} refers to frame {f}, but there are {} frames",
                    self.frame_text.len()
                ))
            })?;
        }
        self.stack_text += text;
        self.profile
            .push_stack(&s.frames.into_iter().map(FrameId).collect::<Vec<_>>())
            .map_err(|e| corrupt(e.to_string()))?;
        Ok(())
    }

    fn samples(&mut self, cols: &schema::Samples) -> Result<(), FormatError> {
        let n = cols.stack.len();
        let lengths = [
            cols.time_delta_ns.len(),
            cols.cpu.len(),
            cols.pid.len(),
            cols.tid.len(),
            cols.comm.len(),
            cols.thread_name.len(),
            cols.gil.len(),
        ];
        if lengths.iter().any(|&l| l != n) {
            return Err(corrupt(format!(
                "sample columns of different lengths ({n} stacks, {lengths:?} other fields)"
            )));
        }
        // Version 3 columns: absent (every sample on a CPU, weight 1) or one value per sample.
        for (name, len) in [("state", cols.state.len()), ("weight", cols.weight.len())] {
            if len != 0 && (len != n || self.version < 3) {
                return Err(corrupt(format!(
                    "a {name} column of {len} values for {n} samples in a version {} file",
                    self.version
                )));
            }
        }
        let mut time = 0u64;
        for i in 0..n {
            let at = self.samples;
            let what = || format!("sample {at}");
            time = time.wrapping_add(cols.time_delta_ns[i] as u64);
            let gil = schema::GilState::try_from(cols.gil[i]).map_err(|_| {
                corrupt(format!("sample {at} has unknown GIL state {}", cols.gil[i]))
            })?;
            let stack = cols.stack[i];
            let depth = self.profile.stack_len(StackId(stack)).ok_or_else(|| {
                corrupt(format!(
                    "sample {at} refers to stack {stack}, but there are {} stacks",
                    self.profile.stack_count()
                ))
            })?;
            self.frame_refs += depth as u64;
            let state = match cols.state.get(i) {
                None => ThreadState::OnCpu,
                Some(&v) => schema::ThreadState::try_from(v)
                    .map(state_from_wire)
                    .map_err(|_| corrupt(format!("sample {at} has unknown thread state {v}")))?,
            };
            let weight = cols.weight.get(i).copied().unwrap_or(1);
            if weight == 0 {
                return Err(corrupt(format!("sample {at} has weight 0")));
            }
            let key = SampleKey {
                stack: StackId(stack),
                pid: cols.pid[i],
                tid: cols.tid[i],
                comm: self.name(cols.comm[i], &what)?,
                thread: self.name(cols.thread_name[i], &what)?,
                gil: gil_from_wire(gil),
                state,
            };
            self.profile.add(&Sample {
                key,
                time_ns: time,
                cpu: cols.cpu[i],
                weight,
            });
            self.samples += 1;
            self.span = Some(
                self.span
                    .map_or((time, time), |(lo, hi)| (lo.min(time), hi.max(time))),
            );
        }
        Ok(())
    }

    /// What rendering will cost, against the bytes the file spent on it (module header).
    fn check_cost(&self, read: u64, new_samples: u64, new_refs: u64) -> Result<(), FormatError> {
        let over = |what: &str, have: u64, per_byte: u64, slack: u64| {
            if have > read.saturating_mul(per_byte).saturating_add(slack) {
                Err(corrupt(format!(
                    "{have} {what} in {read} bytes: more than any recording holds"
                )))
            } else {
                Ok(())
            }
        };
        over(
            "samples",
            self.samples + new_samples,
            SAMPLES_PER_BYTE,
            SLACK,
        )?;
        over(
            "frames over all samples",
            self.frame_refs + new_refs,
            FRAME_REFS_PER_BYTE,
            4 * SLACK,
        )?;
        over(
            "bytes of stack text",
            self.stack_text,
            TEXT_PER_BYTE,
            64 * SLACK,
        )
    }

    fn end(
        &mut self,
        meta: Option<schema::RunMeta>,
        sample_count: Option<u64>,
    ) -> Result<(), FormatError> {
        if !self.started || self.ended {
            return Err(corrupt("an end chunk out of place"));
        }
        self.profile.meta = decode_meta(meta.ok_or_else(|| corrupt("no run metadata"))?)?;
        if let Some(n) = sample_count.filter(|&n| n != self.samples) {
            return Err(corrupt(format!(
                "{} samples, the end chunk counts {n}",
                self.samples
            )));
        }
        self.ended = true;
        Ok(())
    }

    fn finish(mut self) -> Result<Loaded, FormatError> {
        if !self.started {
            return Err(corrupt("no complete chunk"));
        }
        if !self.ended
            && let Some((lo, hi)) = self.span
        {
            // What the run would have written at its end: the time it covered.
            self.profile.meta.duration_s = (hi - lo) as f64 / 1e9;
        }
        let complete = self.ended && !self.cut;
        Ok(Loaded {
            profile: self.profile,
            complete,
        })
    }
}

fn decode_meta(m: schema::RunMeta) -> Result<RunMeta, FormatError> {
    let mut errors = Failures::default();
    let mut seen = std::collections::BTreeSet::new();
    for e in m.errors {
        if !seen.insert(e.kind.clone()) {
            return Err(corrupt(format!("error kind {:?} listed twice", e.kind)));
        }
        errors.add(Failure::from_name(&e.kind), e.count);
    }
    Ok(RunMeta {
        host: m.host,
        kernel: m.kernel,
        start_unix_s: m.start_unix_s,
        duration_s: m.duration_s,
        rate_hz: m.rate_hz,
        cpus: usize::try_from(m.cpus).map_err(|_| corrupt(format!("{} CPUs", m.cpus)))?,
        command_line: m.command_line,
        lost_samples: m.lost_samples,
        errors,
        idle: m.idle,
    })
}
