//! The saved profile (`.pyebpf`): every sample of a run with its metadata, to render any
//! output or `report` from later.
//!
//! Owns: the file format: writing ([`SavedWriter`], streamed during a run;
//! [`writer::write_profile`] for a whole profile, which `output` renders as `-f pyebpf`),
//! reading ([`load`] / [`load_from`], in [`reader`]) and its validation. A loaded profile is
//! the saved one: same frames, stacks and ids, the samples replayed in their order into the same
//! counts, same metadata, so every output renders identically from either. The per-sample
//! timeline (time, CPU) is kept only on request ([`load_with`]: `script`).
//!
//! Layout (format version 2): the 8-byte magic [`MAGIC`] (PNG-style: a high byte, then
//! `PYEBPF`, then a line feed, so text-mode transfers and mistaken file types are caught), a
//! little-endian `u32` format version ([`FORMAT_VERSION`]), then chunks. A chunk is a kind byte
//! ([`ChunkKind`]: start, batch, end), a little-endian `u32` length, and that many bytes: one
//! gzip member holding one protobuf `SavedProfile` message (schema as `.proto` text in
//! [`schema`]). The start chunk carries the writer and the metadata known at the start; each
//! batch appends strings, frames and stacks (ids continue from the previous batch) and samples
//! (column-wise packed varints, times as deltas from the batch's previous sample, the first from
//! 0); the end chunk carries the final metadata and the number of samples. `record` writes a
//! batch about every second, so a run that is killed keeps everything up to its last chunk: a
//! file without an end chunk, or cut inside its last chunk, loads as incomplete
//! ([`Loaded::complete`]). Version 1 (one gzip member holding one message with everything) is
//! still read.
//!
//! The file is untrusted input: see [`reader`] for the limits (every count and size is checked
//! against the file's own length and fixed caps before it is allocated or rendered); gzip's CRC
//! and length catch corruption. Every failure is a [`LoadError`] that displays as one line.

pub mod reader;
pub mod schema;
#[cfg(test)]
mod tests;
pub mod writer;

use std::io;
use std::path::{Path, PathBuf};

use crate::profile::{FrameKind, GilState, ThreadState};

pub use reader::{Loaded, load_from, load_from_with};
pub use writer::SavedWriter;

/// The first 8 bytes of every saved profile.
pub const MAGIC: [u8; 8] = *b"\x89PYEBPF\n";

/// The newest format version this build reads, and the one it writes for a wall-clock run
/// (`record --idle`: samples carry a state and a weight).
pub const FORMAT_VERSION: u32 = 3;
/// The version written for a run without `--idle` (readable by the pyebpf before version 3).
pub const FORMAT_VERSION_PLAIN: u32 = 2;

/// The writer's name in the file.
const WRITER: &str = "pyebpf";

/// The kind of a chunk (its first byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ChunkKind {
    /// Writer and the metadata known at the start.
    Start = 1,
    /// Strings, frames, stacks and samples.
    Batch = 2,
    /// The final metadata and the number of samples.
    End = 3,
}

impl ChunkKind {
    fn from_byte(b: u8) -> Option<ChunkKind> {
        match b {
            1 => Some(ChunkKind::Start),
            2 => Some(ChunkKind::Batch),
            3 => Some(ChunkKind::End),
            _ => None,
        }
    }
}

/// Why a stream is not a readable saved profile. Displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The stream does not start with [`MAGIC`].
    #[error("not a pyebpf profile (bad magic)")]
    BadMagic,
    /// The format version is newer than this build reads.
    #[error(
        "written by a newer pyebpf (format version {version}; this pyebpf reads up to version {FORMAT_VERSION})"
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

/// Reads a saved profile from a file.
pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    load_with(path, false)
}

/// Reads a saved profile from a file; with `timeline` the profile keeps every sample in order
/// ([`crate::profile::Profile::timeline`]).
pub fn load_with(path: &Path, timeline: bool) -> Result<Loaded, LoadError> {
    let with_path = |error| LoadError {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(|e| with_path(FormatError::Read(e)))?;
    load_from_with(file, timeline).map_err(with_path)
}

fn kind_to_wire(k: FrameKind) -> schema::FrameKind {
    match k {
        FrameKind::Process => schema::FrameKind::Process,
        FrameKind::Thread => schema::FrameKind::Thread,
        FrameKind::Python => schema::FrameKind::Python,
        FrameKind::Native => schema::FrameKind::Native,
        FrameKind::Kernel => schema::FrameKind::Kernel,
        FrameKind::Marker => schema::FrameKind::Marker,
        FrameKind::State => schema::FrameKind::State,
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
        schema::FrameKind::State => FrameKind::State,
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

fn state_to_wire(s: ThreadState) -> schema::ThreadState {
    match s {
        ThreadState::OnCpu => schema::ThreadState::OnCpu,
        ThreadState::Runnable => schema::ThreadState::Runnable,
        ThreadState::Sleeping => schema::ThreadState::Sleeping,
        ThreadState::Blocked => schema::ThreadState::Blocked,
        ThreadState::GilWait => schema::ThreadState::GilWait,
    }
}

fn state_from_wire(s: schema::ThreadState) -> ThreadState {
    match s {
        schema::ThreadState::OnCpu => ThreadState::OnCpu,
        schema::ThreadState::Runnable => ThreadState::Runnable,
        schema::ThreadState::Sleeping => ThreadState::Sleeping,
        schema::ThreadState::Blocked => ThreadState::Blocked,
        schema::ThreadState::GilWait => ThreadState::GilWait,
    }
}
