//! The saved profile (`.pyebpf`): every sample of a run with its metadata, to render any
//! output or `report` from later.
//!
//! Owns: the file format (writing with [`Saved`], reading with [`load`] / [`load_from`]) and
//! its validation. A loaded profile is the saved one: same frames, stacks and ids, same samples
//! in the same order, same metadata, so every output renders identically from either.
//!
//! Layout: the 8-byte magic [`MAGIC`] (PNG-style: a high byte, then `PYEBPF`, then a line feed,
//! so text-mode transfers and mistaken file types are caught), a little-endian `u32` format
//! version ([`FORMAT_VERSION`]), then one gzip member holding one protobuf message
//! (`SavedProfile`, schema as `.proto` text in [`schema`]). Strings are interned in one
//! table; samples are stored column-wise as packed varints (time as deltas), which gzip
//! compresses to a few bytes per sample.
//!
//! The file is untrusted input: the decompressed size is capped ([`MAX_PAYLOAD`]), gzip's CRC and
//! length catch truncation and corruption, and every index, count and enum value is checked
//! before a [`Profile`] is built. Every failure is a [`LoadError`] that displays as one line.

pub mod schema;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message as _;

use crate::output::Renderer;
use crate::profile::{Frame, FrameId, FrameKind, GilState, Profile, RunMeta, Sample, StackId};

/// The first 8 bytes of every saved profile.
pub const MAGIC: [u8; 8] = *b"\x89PYEBPF\n";

/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// The largest decompressed message accepted (1 GiB, about 70 million samples).
pub const MAX_PAYLOAD: u64 = 1 << 30;

/// The writer's name in the file.
const WRITER: &str = "pyebpf";

/// Why a stream is not a readable saved profile. Displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The stream does not start with [`MAGIC`].
    #[error("not a pyebpf profile (bad magic)")]
    BadMagic,
    /// The format version is newer than this build reads.
    #[error(
        "written by a newer pyebpf (format version {version}; this pyebpf reads version {FORMAT_VERSION})"
    )]
    Newer {
        /// The file's format version.
        version: u32,
    },
    /// The file is cut short or its content is inconsistent.
    #[error("truncated or corrupt: {0}")]
    Corrupt(String),
    /// Reading failed.
    #[error("cannot read: {0}")]
    Read(io::Error),
}

/// Why a saved profile file cannot be read: the file and the reason. Displays as one line,
/// `FILE: reason`.
#[derive(Debug, thiserror::Error)]
#[error("{}: {error}", path.display())]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub error: FormatError,
}

/// Writer of the saved format.
pub struct Saved;

impl Renderer for Saved {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let payload = encode(profile)?.encode_to_vec();
        out.write_all(&MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&payload)?;
        gz.finish()?;
        Ok(())
    }
}

/// Reads a saved profile from a file.
pub fn load(path: &Path) -> Result<Profile, LoadError> {
    let with_path = |error| LoadError {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(|e| with_path(FormatError::Read(e)))?;
    load_from(file).map_err(with_path)
}

/// Reads a saved profile from a stream (to its end: trailing data is an error).
pub fn load_from(reader: impl Read) -> Result<Profile, FormatError> {
    let mut r = BufReader::new(reader);
    read_header(&mut r)?;
    let payload = decompress(r)?;
    decode_payload(&payload)
}

/// Reads and checks the magic and the format version.
fn read_header(r: &mut impl Read) -> Result<u32, FormatError> {
    let mut header = [0u8; 12];
    let mut n = 0;
    while n < header.len() {
        match r.read(&mut header[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FormatError::Read(e)),
        }
    }
    if n == 0 {
        return Err(FormatError::Corrupt("empty file".into()));
    }
    let magic_len = n.min(MAGIC.len());
    if header[..magic_len] != MAGIC[..magic_len] {
        return Err(FormatError::BadMagic);
    }
    if n < header.len() {
        return Err(FormatError::Corrupt(format!(
            "{n}-byte file, shorter than the 12-byte header"
        )));
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version > FORMAT_VERSION {
        return Err(FormatError::Newer { version });
    }
    if version == 0 {
        return Err(FormatError::Corrupt("format version 0".into()));
    }
    Ok(version)
}

/// Decompresses the gzip member that follows the header, up to [`MAX_PAYLOAD`] bytes, and
/// checks that nothing follows it.
fn decompress(r: impl BufRead) -> Result<Vec<u8>, FormatError> {
    let corrupt_or_read = |e: io::Error| match e.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput | io::ErrorKind::UnexpectedEof => {
            FormatError::Corrupt(format!("compressed data: {e}"))
        }
        _ => FormatError::Read(e),
    };
    let mut limited = flate2::bufread::GzDecoder::new(r).take(MAX_PAYLOAD + 1);
    let mut payload = Vec::new();
    limited.read_to_end(&mut payload).map_err(corrupt_or_read)?;
    if payload.len() as u64 > MAX_PAYLOAD {
        return Err(FormatError::Corrupt(format!(
            "more than {} MiB uncompressed",
            MAX_PAYLOAD >> 20
        )));
    }
    if payload.is_empty() {
        return Err(FormatError::Corrupt("no profile after the header".into()));
    }
    let mut rest = limited.into_inner().into_inner();
    if !rest.fill_buf().map_err(FormatError::Read)?.is_empty() {
        return Err(FormatError::Corrupt(
            "data after the end of the compressed profile".into(),
        ));
    }
    Ok(payload)
}

/// Decodes and validates the protobuf message.
pub(crate) fn decode_payload(payload: &[u8]) -> Result<Profile, FormatError> {
    let msg = schema::SavedProfile::decode(payload)
        .map_err(|e| FormatError::Corrupt(format!("bad message: {e}")))?;
    decode(msg).map_err(FormatError::Corrupt)
}

/// The saved message of a profile.
fn encode(profile: &Profile) -> io::Result<schema::SavedProfile> {
    let mut strings = Strings::default();
    let frames = profile
        .frames()
        .iter()
        .map(|f| {
            Ok(schema::Frame {
                kind: kind_to_wire(f.kind) as i32,
                name: strings.index(&f.name)?,
                module: f.module.as_deref().map(|m| strings.index(m)).transpose()?,
                file: f.file.as_deref().map(|m| strings.index(m)).transpose()?,
                line: f.line,
            })
        })
        .collect::<io::Result<Vec<_>>>()?;
    let stacks = profile
        .stacks()
        .iter()
        .map(|s| schema::Stack {
            frames: s.iter().map(|f| f.0).collect(),
        })
        .collect();
    let n = profile.samples().len();
    let mut cols = schema::Samples {
        time_delta_ns: Vec::with_capacity(n),
        cpu: Vec::with_capacity(n),
        pid: Vec::with_capacity(n),
        tid: Vec::with_capacity(n),
        comm: Vec::with_capacity(n),
        thread_name: Vec::with_capacity(n),
        gil: Vec::with_capacity(n),
        stack: Vec::with_capacity(n),
    };
    let mut prev = 0u64;
    for s in profile.samples() {
        cols.time_delta_ns.push(s.time_ns.wrapping_sub(prev) as i64);
        prev = s.time_ns;
        cols.cpu.push(s.cpu);
        cols.pid.push(s.pid);
        cols.tid.push(s.tid);
        cols.comm.push(strings.index(&s.comm)?);
        cols.thread_name.push(strings.index(&s.thread_name)?);
        cols.gil.push(gil_to_wire(s.gil) as i32);
        cols.stack.push(s.stack.0);
    }
    let m = &profile.meta;
    let meta = schema::RunMeta {
        host: m.host.clone(),
        kernel: m.kernel.clone(),
        start_unix_s: m.start_unix_s,
        duration_s: m.duration_s,
        rate_hz: m.rate_hz,
        cpus: m.cpus as u64,
        command_line: m.command_line.clone(),
        lost_samples: m.lost_samples,
        errors: m
            .errors
            .iter()
            .map(|(kind, &count)| schema::ErrorCount {
                kind: kind.clone(),
                count,
            })
            .collect(),
    };
    Ok(schema::SavedProfile {
        writer: WRITER.to_string(),
        writer_version: env!("CARGO_PKG_VERSION").to_string(),
        meta: Some(meta),
        strings: strings.list,
        frames,
        stacks,
        samples: Some(cols),
    })
}

/// The string table being written.
#[derive(Default)]
struct Strings {
    list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Strings {
    fn index(&mut self, s: &str) -> io::Result<u32> {
        if let Some(&i) = self.index.get(s) {
            return Ok(i);
        }
        let i = u32::try_from(self.list.len())
            .map_err(|_| io::Error::other("more than 2^32 strings to save"))?;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        Ok(i)
    }
}

/// The profile of a decoded message; every index and value checked. The error is the detail
/// of [`FormatError::Corrupt`].
fn decode(msg: schema::SavedProfile) -> Result<Profile, String> {
    if msg.writer.is_empty() {
        return Err("no writer name".into());
    }
    let meta = decode_meta(msg.meta.ok_or("no run metadata")?)?;
    let strings: Vec<Arc<str>> = msg.strings.into_iter().map(Arc::from).collect();
    let string = |i: u32, what: &dyn Fn() -> String| {
        strings.get(i as usize).cloned().ok_or_else(|| {
            format!(
                "{} names string {i}, but there are {} strings",
                what(),
                strings.len()
            )
        })
    };
    let mut frames = Vec::with_capacity(msg.frames.len());
    for (i, f) in msg.frames.into_iter().enumerate() {
        let what = || format!("frame {i}");
        let kind = schema::FrameKind::try_from(f.kind)
            .ok()
            .and_then(kind_from_wire)
            .ok_or_else(|| format!("frame {i} has unknown kind {}", f.kind))?;
        frames.push(Frame {
            kind,
            name: string(f.name, &what)?,
            module: f.module.map(|m| string(m, &what)).transpose()?,
            file: f.file.map(|m| string(m, &what)).transpose()?,
            line: f.line,
        });
    }
    let stacks: Vec<Box<[FrameId]>> = msg
        .stacks
        .into_iter()
        .map(|s| s.frames.into_iter().map(FrameId).collect())
        .collect();
    let cols = msg.samples.ok_or("no samples")?;
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
        return Err(format!(
            "sample columns of different lengths ({n} stacks, {lengths:?} other fields)"
        ));
    }
    let mut samples = Vec::with_capacity(n);
    let mut time = 0u64;
    for i in 0..n {
        let what = || format!("sample {i}");
        time = time.wrapping_add(cols.time_delta_ns[i] as u64);
        let gil = schema::GilState::try_from(cols.gil[i])
            .map_err(|_| format!("sample {i} has unknown GIL state {}", cols.gil[i]))?;
        samples.push(Sample {
            stack: StackId(cols.stack[i]),
            time_ns: time,
            pid: cols.pid[i],
            tid: cols.tid[i],
            cpu: cols.cpu[i],
            comm: string(cols.comm[i], &what)?,
            thread_name: string(cols.thread_name[i], &what)?,
            gil: gil_from_wire(gil),
        });
    }
    Profile::from_parts(meta, frames, stacks, samples).map_err(|e| e.to_string())
}

fn decode_meta(m: schema::RunMeta) -> Result<RunMeta, String> {
    let mut errors = BTreeMap::new();
    for e in m.errors {
        if errors.insert(e.kind.clone(), e.count).is_some() {
            return Err(format!("error kind {:?} listed twice", e.kind));
        }
    }
    Ok(RunMeta {
        host: m.host,
        kernel: m.kernel,
        start_unix_s: m.start_unix_s,
        duration_s: m.duration_s,
        rate_hz: m.rate_hz,
        cpus: usize::try_from(m.cpus).map_err(|_| format!("{} CPUs", m.cpus))?,
        command_line: m.command_line,
        lost_samples: m.lost_samples,
        errors,
    })
}

fn kind_to_wire(k: FrameKind) -> schema::FrameKind {
    match k {
        FrameKind::Process => schema::FrameKind::Process,
        FrameKind::Thread => schema::FrameKind::Thread,
        FrameKind::Python => schema::FrameKind::Python,
        FrameKind::Native => schema::FrameKind::Native,
        FrameKind::Kernel => schema::FrameKind::Kernel,
        FrameKind::Marker => schema::FrameKind::Marker,
    }
}

fn kind_from_wire(k: schema::FrameKind) -> Option<FrameKind> {
    Some(match k {
        schema::FrameKind::Unspecified => return None,
        schema::FrameKind::Process => FrameKind::Process,
        schema::FrameKind::Thread => FrameKind::Thread,
        schema::FrameKind::Python => FrameKind::Python,
        schema::FrameKind::Native => FrameKind::Native,
        schema::FrameKind::Kernel => FrameKind::Kernel,
        schema::FrameKind::Marker => FrameKind::Marker,
    })
}

fn gil_to_wire(g: GilState) -> schema::GilState {
    match g {
        GilState::Unknown => schema::GilState::Unknown,
        GilState::Held => schema::GilState::Held,
        GilState::Released => schema::GilState::Released,
        GilState::Disabled => schema::GilState::Disabled,
    }
}

fn gil_from_wire(g: schema::GilState) -> GilState {
    match g {
        schema::GilState::Unknown => GilState::Unknown,
        schema::GilState::Held => GilState::Held,
        schema::GilState::Released => GilState::Released,
        schema::GilState::Disabled => GilState::Disabled,
    }
}
