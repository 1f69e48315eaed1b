//! Writing the saved format: [`SavedWriter`] streams a run as it is sampled, one chunk per
//! batch, so a run that is killed keeps everything up to its last chunk.
//!
//! API (small on purpose, for whoever feeds it): [`SavedWriter::new`] with the metadata known at
//! the start; [`SavedWriter::write_batch`] with the profile (its frames and stacks interned so
//! far: only the ones not written yet are written; its names) and the samples gathered since
//! the previous batch (they can be dropped from memory afterwards); [`SavedWriter::finish`]
//! with the final metadata (duration, lost samples, errors).

use std::collections::HashMap;
use std::io::{self, Write};

use prost::Message as _;

use super::{
    ChunkKind, FORMAT_VERSION, FORMAT_VERSION_PLAIN, MAGIC, WRITER, gil_to_wire, kind_to_wire,
    schema, state_to_wire,
};
use crate::profile::{NameId, Profile, RunMeta, Sample, StackId};

/// Samples per chunk when a whole profile is saved at once ([`write_profile`]).
pub const SAMPLES_PER_CHUNK: usize = 1 << 16;

/// A saved profile being written.
pub struct SavedWriter<W: Write> {
    out: W,
    strings: Strings,
    /// Frames and stacks already written (the next batch starts at these ids).
    frames: usize,
    stacks: usize,
    samples: u64,
    /// Version 3: samples carry a state and a weight.
    weighted: bool,
    /// The string index of each of the profile's names ([`NameId`]), once written.
    names: Vec<Option<u32>>,
}

impl<W: Write> SavedWriter<W> {
    /// Writes the header and the start chunk (writer, `meta` as known at the start). A
    /// wall-clock run (`meta.idle`) is written as version 3, any other as version 2.
    pub fn new(mut out: W, meta: &RunMeta) -> io::Result<Self> {
        let mut head = MAGIC.to_vec();
        let version = if meta.idle {
            FORMAT_VERSION
        } else {
            FORMAT_VERSION_PLAIN
        };
        head.extend_from_slice(&version.to_le_bytes());
        out.write_all(&head)?;
        let msg = schema::SavedProfile {
            writer: WRITER.to_string(),
            writer_version: env!("CARGO_PKG_VERSION").to_string(),
            meta: Some(meta_to_wire(meta)),
            ..schema::SavedProfile::default()
        };
        write_chunk(&mut out, ChunkKind::Start, &msg)?;
        Ok(SavedWriter {
            out,
            strings: Strings::default(),
            frames: 0,
            stacks: 0,
            samples: 0,
            weighted: meta.idle,
            names: Vec::new(),
        })
    }

    /// Writes one chunk: the frames and stacks of `profile` not written yet, and `samples`
    /// (keyed in `profile`). Nothing is written for an empty batch.
    pub fn write_batch(&mut self, profile: &Profile, samples: &[Sample]) -> io::Result<()> {
        let frames = profile.frames();
        let new_frames = frames.get(self.frames..).unwrap_or_default();
        let new_stacks = self.stacks..profile.stack_count().max(self.stacks);
        if new_frames.is_empty() && new_stacks.is_empty() && samples.is_empty() {
            return Ok(());
        }
        let first_string = self.strings.list.len();
        let frames_msg = new_frames
            .iter()
            .map(|f| {
                Ok(schema::Frame {
                    kind: kind_to_wire(f.kind) as i32,
                    name: self.strings.index(&f.name)?,
                    module: f
                        .module
                        .as_deref()
                        .map(|m| self.strings.index(m))
                        .transpose()?,
                    file: f
                        .file
                        .as_deref()
                        .map(|m| self.strings.index(m))
                        .transpose()?,
                    line: f.line,
                    short_file: f
                        .short_file
                        .as_deref()
                        .map(|m| self.strings.index(m))
                        .transpose()?,
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        let stacks_msg = new_stacks
            .map(|i| schema::Stack {
                frames: profile
                    .stack(StackId(i as u32))
                    .iter()
                    .map(|f| f.0)
                    .collect(),
            })
            .collect();
        let cols = self.columns(profile, samples)?;
        let msg = schema::SavedProfile {
            strings: self.strings.list[first_string..].to_vec(),
            frames: frames_msg,
            stacks: stacks_msg,
            samples: Some(cols),
            ..schema::SavedProfile::default()
        };
        write_chunk(&mut self.out, ChunkKind::Batch, &msg)?;
        self.frames = frames.len();
        self.stacks = profile.stack_count();
        self.samples += samples.len() as u64;
        Ok(())
    }

    /// The string index of the profile's name `id`.
    fn name(&mut self, profile: &Profile, id: NameId) -> io::Result<u32> {
        let i = id.0 as usize;
        if let Some(Some(s)) = self.names.get(i) {
            return Ok(*s);
        }
        let s = self.strings.index(profile.name(id))?;
        if self.names.len() <= i {
            self.names.resize(i + 1, None);
        }
        self.names[i] = Some(s);
        Ok(s)
    }

    /// The sample columns of a batch; time deltas start from 0 in every batch.
    fn columns(&mut self, profile: &Profile, samples: &[Sample]) -> io::Result<schema::Samples> {
        let n = samples.len();
        let mut cols = schema::Samples {
            time_delta_ns: Vec::with_capacity(n),
            cpu: Vec::with_capacity(n),
            pid: Vec::with_capacity(n),
            tid: Vec::with_capacity(n),
            comm: Vec::with_capacity(n),
            thread_name: Vec::with_capacity(n),
            gil: Vec::with_capacity(n),
            stack: Vec::with_capacity(n),
            state: Vec::new(),
            weight: Vec::new(),
        };
        let mut prev = 0u64;
        for s in samples {
            let k = &s.key;
            cols.time_delta_ns.push(s.time_ns.wrapping_sub(prev) as i64);
            prev = s.time_ns;
            cols.cpu.push(s.cpu);
            cols.pid.push(k.pid);
            cols.tid.push(k.tid);
            cols.comm.push(self.name(profile, k.comm)?);
            cols.thread_name.push(self.name(profile, k.thread)?);
            cols.gil.push(gil_to_wire(k.gil) as i32);
            cols.stack.push(k.stack.0);
        }
        if self.weighted {
            cols.state = samples
                .iter()
                .map(|s| state_to_wire(s.key.state) as i32)
                .collect();
            cols.weight = samples.iter().map(|s| s.weight).collect();
        } else if let Some(s) = samples
            .iter()
            .find(|s| s.weight != 1 || s.key.state.is_off_cpu())
        {
            return Err(io::Error::other(format!(
                "a {} sample of weight {} in a profile not marked as a wall-clock run",
                s.key.state.as_str(),
                s.weight
            )));
        }
        Ok(cols)
    }

    /// Writes the end chunk (the final `meta`, the number of samples) and flushes; returns the
    /// writer.
    pub fn finish(mut self, meta: &RunMeta) -> io::Result<W> {
        let msg = schema::SavedProfile {
            meta: Some(meta_to_wire(meta)),
            sample_count: Some(self.samples),
            ..schema::SavedProfile::default()
        };
        write_chunk(&mut self.out, ChunkKind::End, &msg)?;
        Ok(self.out)
    }
}

/// Writes a whole profile: start, batches of [`SAMPLES_PER_CHUNK`] samples, end. The saved
/// format keeps every sample, so the profile must have kept its timeline (a saved file loaded
/// with it); `record` streams its samples with [`SavedWriter`] instead.
pub fn write_profile(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let samples = profile.timeline().ok_or_else(|| {
        io::Error::other("the saved format needs every sample, and this profile kept only counts")
    })?;
    let mut w = SavedWriter::new(out, &profile.meta)?;
    if samples.is_empty() {
        w.write_batch(profile, &[])?;
    }
    for batch in samples.chunks(SAMPLES_PER_CHUNK) {
        w.write_batch(profile, batch)?;
    }
    w.finish(&profile.meta)?;
    Ok(())
}

/// One chunk: its kind, the length of its body, then the body (one gzip member holding the
/// message), written with one `write_all` and flushed.
pub(super) fn write_chunk(
    out: &mut dyn Write,
    kind: ChunkKind,
    msg: &schema::SavedProfile,
) -> io::Result<()> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&msg.encode_to_vec())?;
    let body = gz.finish()?;
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::other("a saved chunk of more than 4 GiB"))?;
    let mut chunk = Vec::with_capacity(body.len() + 5);
    chunk.push(kind as u8);
    chunk.extend_from_slice(&len.to_le_bytes());
    chunk.extend_from_slice(&body);
    out.write_all(&chunk)?;
    out.flush()
}

pub(super) fn meta_to_wire(m: &RunMeta) -> schema::RunMeta {
    schema::RunMeta {
        host: m.host.clone(),
        kernel: m.kernel.clone(),
        start_unix_s: m.start_unix_s,
        duration_s: m.duration_s,
        rate_hz: m.rate_hz,
        cpus: m.cpus as u64,
        command_line: m.command_line.clone(),
        lost_samples: m.lost_samples,
        idle: m.idle,
        errors: m
            .errors
            .named()
            .into_iter()
            .map(|(kind, count)| schema::ErrorCount { kind, count })
            .collect(),
    }
}

/// The string table being written.
#[derive(Default)]
pub(super) struct Strings {
    pub(super) list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Strings {
    pub(super) fn index(&mut self, s: &str) -> io::Result<u32> {
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
