//! Recorded snapshots: what the reader needs of one CPython process, as bytes.
//!
//! Owns: [`Snapshot`] — the runtime's addresses as `detect` places them (`_PyRuntime`,
//! `Py_Version`, `PyCode_Type`, the known objects, `.bss`, …), the threads (id, thread
//! pointer) and the pages of memory the reader touched — with its byte encoding
//! ([`Snapshot::encode`], [`Snapshot::decode`]); [`RecordingMemory`], which records the pages a
//! live read touches (the bytes it read); [`Snapshot::attach`], a [`PythonProcess`] over a snapshot (the image
//! path of `dump --core`, without the core).
//! Input: a live pid ([`Snapshot::record`]) or bytes. Output: a snapshot, or a process to read.
//! Constraints: decoding is the coverage-guided fuzzer's entry to the reader (`fuzz/`), so the
//! bytes are untrusted: every count is capped ([`MAX_REGIONS`], [`MAX_ENTRIES`]), lengths are
//! checked against the input, nothing panics. Little-endian throughout.
//!
//! Layout: [`MAGIC`]; `u32` pid; `u64` runtime address and size; five optional addresses as
//! `u64` (0: absent) — `Py_Version`, `PyCode_Type`, `_Py_NoneStruct`, `PyFrame_Type`, glibc's
//! `_thread_db_pthread_tid`; `.bss` address and size (size 0: absent); `u8` 1 for a CPython
//! older than 3.7; `u16` count then (`u8` index into `KNOWN_SYMBOLS`, `u64` address) per
//! known object; `u16` count then (`u64`, `u64`) per image range; `u16` count then (`u32`
//! tid, `u64` thread pointer) per thread; `u32` count then (`u64` start, `u32` length,
//! bytes) per memory region.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::detect::Detected;
use super::memory::{ImageMemory, MemError, ProcessMemory, ReadMemory};
use super::objects::{KNOWN_SYMBOLS, KnownObjects};
use super::{PyError, PythonProcess, Source};
use crate::procs::{FileId, Mapping, Perms};

/// First bytes of an encoded snapshot.
pub const MAGIC: &[u8; 8] = b"PYSNAP1\n";
/// Memory regions per snapshot.
pub const MAX_REGIONS: usize = 1 << 16;
/// Known objects, image ranges and threads per snapshot (each).
pub const MAX_ENTRIES: usize = 4096;

/// One process as the reader saw it (see the module header).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub pid: u32,
    pub runtime_addr: u64,
    pub runtime_size: u64,
    pub py_version_addr: Option<u64>,
    pub pycode_type_addr: Option<u64>,
    pub none_addr: Option<u64>,
    pub pyframe_type_addr: Option<u64>,
    pub pthread_tid_desc: Option<u64>,
    pub bss: Option<(u64, u64)>,
    pub pre_runtime: bool,
    pub known: KnownObjects,
    pub image: Vec<(u64, u64)>,
    /// (thread id, thread pointer).
    pub threads: Vec<(u32, u64)>,
    /// Memory by start address.
    pub regions: BTreeMap<u64, Vec<u8>>,
}

/// Why bytes are not a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a snapshot (no magic)")]
    Magic,
    #[error("snapshot truncated at byte {0}")]
    Truncated(usize),
    #[error("snapshot has {count} {what}, more than {max}")]
    TooMany {
        what: &'static str,
        count: usize,
        max: usize,
    },
}

/// A cursor over untrusted bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(SnapshotError::Truncated(self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn opt(&mut self) -> Result<Option<u64>, SnapshotError> {
        Ok(Some(self.u64()?).filter(|&a| a != 0))
    }

    fn count(
        &mut self,
        wide: bool,
        what: &'static str,
        max: usize,
    ) -> Result<usize, SnapshotError> {
        let count = if wide {
            self.u32()? as usize
        } else {
            usize::from(self.u16()?)
        };
        if count > max {
            return Err(SnapshotError::TooMany { what, count, max });
        }
        Ok(count)
    }
}

impl Snapshot {
    /// The bytes of this snapshot (see the module header).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend(self.pid.to_le_bytes());
        for v in [self.runtime_addr, self.runtime_size] {
            out.extend(v.to_le_bytes());
        }
        for v in [
            self.py_version_addr,
            self.pycode_type_addr,
            self.none_addr,
            self.pyframe_type_addr,
            self.pthread_tid_desc,
        ] {
            out.extend(v.unwrap_or(0).to_le_bytes());
        }
        let (bss, bss_size) = self.bss.unwrap_or((0, 0));
        out.extend(bss.to_le_bytes());
        out.extend(bss_size.to_le_bytes());
        out.push(u8::from(self.pre_runtime));
        let known: Vec<(u8, u64)> = KNOWN_SYMBOLS
            .iter()
            .enumerate()
            .filter_map(|(i, (_, k))| Some((i as u8, self.known.get(*k)?)))
            .collect();
        out.extend((known.len() as u16).to_le_bytes());
        for (i, a) in known {
            out.push(i);
            out.extend(a.to_le_bytes());
        }
        out.extend((self.image.len().min(MAX_ENTRIES) as u16).to_le_bytes());
        for (lo, hi) in self.image.iter().take(MAX_ENTRIES) {
            out.extend(lo.to_le_bytes());
            out.extend(hi.to_le_bytes());
        }
        out.extend((self.threads.len().min(MAX_ENTRIES) as u16).to_le_bytes());
        for (tid, fs) in self.threads.iter().take(MAX_ENTRIES) {
            out.extend(tid.to_le_bytes());
            out.extend(fs.to_le_bytes());
        }
        out.extend((self.regions.len().min(MAX_REGIONS) as u32).to_le_bytes());
        for (start, bytes) in self.regions.iter().take(MAX_REGIONS) {
            out.extend(start.to_le_bytes());
            out.extend((bytes.len() as u32).to_le_bytes());
            out.extend(bytes);
        }
        out
    }

    /// A snapshot from untrusted bytes. Bytes after the last region are ignored.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        Self::decode_prefix(bytes).map(|(s, _)| s)
    }

    /// A snapshot from the start of `bytes`, and how many bytes it took.
    pub fn decode_prefix(bytes: &[u8]) -> Result<(Snapshot, usize), SnapshotError> {
        let mut c = Cursor { bytes, at: 0 };
        if c.take(MAGIC.len()).ok() != Some(&MAGIC[..]) {
            return Err(SnapshotError::Magic);
        }
        let mut s = Snapshot {
            pid: c.u32()?,
            runtime_addr: c.u64()?,
            runtime_size: c.u64()?,
            py_version_addr: c.opt()?,
            pycode_type_addr: c.opt()?,
            none_addr: c.opt()?,
            pyframe_type_addr: c.opt()?,
            pthread_tid_desc: c.opt()?,
            ..Snapshot::default()
        };
        let (bss, bss_size) = (c.u64()?, c.u64()?);
        s.bss = (bss_size != 0).then_some((bss, bss_size));
        s.pre_runtime = c.u8()? == 1;
        for _ in 0..c.count(false, "known objects", MAX_ENTRIES)? {
            let (i, addr) = (c.u8()?, c.u64()?);
            if let Some((_, k)) = KNOWN_SYMBOLS.get(usize::from(i)) {
                s.known.set(*k, addr);
            }
        }
        for _ in 0..c.count(false, "image ranges", MAX_ENTRIES)? {
            s.image.push((c.u64()?, c.u64()?));
        }
        for _ in 0..c.count(false, "threads", MAX_ENTRIES)? {
            s.threads.push((c.u32()?, c.u64()?));
        }
        for _ in 0..c.count(true, "memory regions", MAX_REGIONS)? {
            let start = c.u64()?;
            // A region cut short by the end of the input keeps what there is (fuzzed inputs).
            let len = (c.u32()? as usize).min(bytes.len() - c.at);
            s.regions.insert(start, c.take(len)?.to_vec());
        }
        Ok((s, c.at))
    }

    /// The memory of this snapshot.
    pub fn memory(&self) -> ImageMemory {
        let mut m = ImageMemory::new();
        for (start, bytes) in &self.regions {
            m.insert(*start, bytes.clone());
        }
        m
    }

    /// Where `detect` would have placed the runtime (with a file identity of its own; snapshots
    /// never use the per-file layout cache).
    fn detected(&self) -> Detected {
        static NEXT_INODE: AtomicU64 = AtomicU64::new(1);
        let mapping = Mapping {
            start: self.image.first().map_or(0, |r| r.0),
            end: self.image.first().map_or(0, |r| r.1),
            file_offset: 0,
            perms: Perms {
                read: true,
                ..Perms::default()
            },
            dev: (0, 0),
            inode: NEXT_INODE.fetch_add(1, Ordering::Relaxed),
            path: None,
        };
        Detected {
            path: "(snapshot)".into(),
            file: FileId::new(&mapping, None),
            mapping,
            bias: 0,
            runtime_addr: self.runtime_addr,
            runtime_size: self.runtime_size,
            py_version_addr: self.py_version_addr,
            pycode_type_addr: self.pycode_type_addr,
            none_addr: self.none_addr,
            known: self.known.clone(),
            pyframe_type_addr: self.pyframe_type_addr,
            bss: self.bss,
            pre_runtime: self.pre_runtime,
            pthread_tid_desc: self.pthread_tid_desc,
            image: self.image.clone(),
        }
    }

    /// A process over this snapshot: version, layout (checked as for a live process) and
    /// threads come from its memory, as `dump --core` reads a core.
    pub fn attach(&self) -> Result<PythonProcess, PyError> {
        self.attach_with(Box::new(self.memory()))
    }

    /// [`Snapshot::attach`] reading through `mem` (this snapshot's memory, watched or changed).
    pub fn attach_with(&self, mem: Box<dyn ReadMemory + Send>) -> Result<PythonProcess, PyError> {
        PythonProcess::choose(
            self.pid,
            vec![self.detected()],
            mem,
            Source::Image {
                threads: self.threads.clone(),
            },
            false,
        )
    }

    /// Reads the live process `pid` as `dump` does (with `limits`) and keeps every byte that
    /// read touched: a snapshot that reads back the same stacks while nothing else changes.
    pub fn record(
        pid: u32,
        limits: super::Limits,
    ) -> Result<(Snapshot, Vec<super::PyThread>), PyError> {
        let candidates = super::detect::detect(pid)?;
        Self::record_with(
            pid,
            candidates,
            ProcessMemory::new(pid),
            Source::Live,
            limits,
        )
    }

    /// This snapshot with only the memory a read with `limits` touches (a smaller seed that
    /// reads back the same).
    pub fn trimmed(
        &self,
        limits: super::Limits,
    ) -> Result<(Snapshot, Vec<super::PyThread>), PyError> {
        Self::record_with(
            self.pid,
            vec![self.detected()],
            self.memory(),
            Source::Image {
                threads: self.threads.clone(),
            },
            limits,
        )
    }

    fn record_with<M: ReadMemory + Send + 'static>(
        pid: u32,
        candidates: Vec<Detected>,
        inner: M,
        source: Source,
        limits: super::Limits,
    ) -> Result<(Snapshot, Vec<super::PyThread>), PyError> {
        let pieces = Arc::new(Mutex::new(Vec::new()));
        let mem = RecordingMemory {
            inner,
            pieces: Arc::clone(&pieces),
        };
        let image_threads = match &source {
            Source::Image { threads } => Some(threads.clone()),
            Source::Live => None,
        };
        // Uncached: the layout is read from (and recorded with) this memory.
        let mut proc = PythonProcess::choose(pid, candidates, Box::new(mem), source, false)?;
        proc.set_limits(limits);
        let threads = proc.threads()?;
        proc.gil_enabled()?;
        let d = proc.detected();
        let regions = pieces.lock().map(|p| coalesce(&p)).unwrap_or_default();
        let snapshot = Snapshot {
            pid,
            runtime_addr: d.runtime_addr,
            runtime_size: d.runtime_size,
            py_version_addr: d.py_version_addr,
            pycode_type_addr: d.pycode_type_addr,
            none_addr: d.none_addr,
            pyframe_type_addr: d.pyframe_type_addr,
            pthread_tid_desc: d.pthread_tid_desc,
            bss: d.bss,
            pre_runtime: d.pre_runtime,
            known: d.known.clone(),
            image: d.image.clone(),
            threads: image_threads.unwrap_or_else(|| {
                threads
                    .iter()
                    .filter_map(|t| Some((u32::try_from(t.native_thread_id).ok()?, 0)))
                    .collect()
            }),
            regions,
        };
        Ok((snapshot, threads))
    }
}

/// Overlapping and adjacent pieces merged into regions (reads resolve to one region each).
fn coalesce(pieces: &[(u64, Vec<u8>)]) -> BTreeMap<u64, Vec<u8>> {
    let mut sorted: Vec<&(u64, Vec<u8>)> = pieces.iter().collect();
    sorted.sort_by_key(|(a, b)| (*a, std::cmp::Reverse(b.len())));
    let mut out: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut current: Option<(u64, Vec<u8>)> = None;
    for (start, bytes) in sorted {
        let end = start.saturating_add(bytes.len() as u64);
        match &mut current {
            Some((cs, cb)) if *start <= *cs + cb.len() as u64 => {
                let cend = *cs + cb.len() as u64;
                if end > cend {
                    let from = (cend - start) as usize;
                    cb.extend_from_slice(&bytes[from..]);
                }
            }
            _ => {
                if let Some((cs, cb)) = current.take() {
                    out.insert(cs, cb);
                }
                current = Some((*start, bytes.clone()));
            }
        }
    }
    if let Some((cs, cb)) = current {
        out.insert(cs, cb);
    }
    out
}

/// Every successful read: (address, bytes).
type Pieces = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// Memory that keeps a copy of every successful read (the bytes asked for: seeds stay a few
/// KiB to tens of KiB, where whole pages would be hundreds).
struct RecordingMemory<M> {
    inner: M,
    pieces: Pieces,
}

impl<M: ReadMemory> ReadMemory for RecordingMemory<M> {
    fn refresh(&self) {
        self.inner.refresh();
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.inner.read(addr, buf)?;
        if let Ok(mut pieces) = self.pieces.lock() {
            pieces.push((addr, buf.to_vec()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_untrusted_bytes() {
        let mut s = Snapshot {
            pid: 7,
            runtime_addr: 0x1000,
            runtime_size: 0x200,
            py_version_addr: Some(0x2000),
            bss: Some((0x3000, 64)),
            image: vec![(0x1000, 0x4000)],
            threads: vec![(7, 0x7f00)],
            ..Snapshot::default()
        };
        s.known.set(super::super::objects::Known::Str, 0x1800);
        s.regions.insert(0x1000, vec![1, 2, 3]);
        s.regions.insert(0x5000, vec![]);
        let bytes = s.encode();
        assert_eq!(Snapshot::decode(&bytes), Ok(s.clone()));
        // Every prefix is an error (the last region is empty), never a panic.
        for n in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
        assert_eq!(Snapshot::decode(b"PYSNAP0\n"), Err(SnapshotError::Magic));
        // A count above the cap is refused before anything is allocated.
        let mut huge = bytes.clone();
        let at = huge.len() - (8 + 4 + 3 + 8 + 4) - 4;
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Snapshot::decode(&huge),
            Err(SnapshotError::TooMany { .. })
        ));
    }
}
