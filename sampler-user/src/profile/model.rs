//! [`Profile`]: the interned frames, stacks and names of a run and its samples counted by
//! [`SampleKey`], in the order each key was first seen (so a profile rebuilt from a saved file,
//! which replays the samples in their order, is the recorded one, ids and order alike).

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, Hash};
use std::sync::Arc;

use super::{
    FileNames, Frame, FrameId, NameId, RunMeta, Sample, SampleKey, StackId, sanitize_label,
};
use crate::lru::{FastHasher, FastSet};

/// The samples counted under one key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Samples.
    pub samples: u64,
    /// Their weights' sum (the samples' count without `--idle`): what shares are shares of.
    pub weight: u64,
}

impl Counts {
    fn add(&mut self, weight: u32) {
        self.samples += 1;
        self.weight += u64::from(weight);
    }
}

/// The index of an interned list: each value is stored once, in its `Vec`; the table holds
/// only indices into it, found by the value's hash (a map keyed by the value would hold a
/// second copy of every frame, stack and key: on a host with process churn, where each
/// process brings its own `comm (pid)` root, stacks and keys, that copy was most of what a
/// process cost).
#[derive(Default)]
struct Index {
    table: hashbrown::HashTable<u32>,
    hasher: FastHasher,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("len", &self.table.len())
            .finish_non_exhaustive()
    }
}

impl Index {
    /// The index of `value` in `list`, whose elements `key` compares.
    fn find<T, Q: Hash + Eq + ?Sized>(
        &self,
        list: &[T],
        key: impl Fn(&T) -> &Q,
        value: &Q,
    ) -> Option<u32> {
        let hash = self.hasher.hash_one(value);
        self.table
            .find(hash, |&i| key(&list[i as usize]) == value)
            .copied()
    }

    /// Records that `list[i]` (just pushed, not in the index yet) is at `i`.
    fn insert<T, Q: Hash + ?Sized>(&mut self, list: &[T], key: impl Fn(&T) -> &Q, i: u32) {
        let hasher = &self.hasher;
        let hash = hasher.hash_one(key(&list[i as usize]));
        self.table
            .insert_unique(hash, i, |&j| hasher.hash_one(key(&list[j as usize])));
    }

    fn clear(&mut self) {
        self.table.clear();
    }

    fn len(&self) -> usize {
        self.table.len()
    }
}

/// A stack as stored: its first frame (in `record`, the `comm (pid)` root) and the rest, a
/// tail interned on its own. Processes that run the same code share their tails, so each
/// process's stacks cost a few bytes each, not a copy of every frame id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Stored {
    /// The first frame (`None`: the empty stack).
    head: Option<FrameId>,
    /// The rest, an index into `tails`.
    tail: u32,
}

/// Interned frames, stacks and names, and the samples counted by key.
#[derive(Debug, Default)]
pub struct Profile {
    frames: Vec<Frame>,
    frame_ids: Index,
    stacks: Vec<Stored>,
    stack_ids: Index,
    /// Every stack's frames after its first.
    tails: Vec<Box<[FrameId]>>,
    tail_ids: Index,
    names: Vec<Arc<str>>,
    name_ids: Index,
    /// Counts by key, in first-seen order.
    counts: Vec<(SampleKey, Counts)>,
    count_ids: Index,
    /// Processes with samples.
    pids: FastSet<u32>,
    totals: Counts,
    /// The samples one by one, when kept (a loaded saved file, on request).
    timeline: Option<Vec<Sample>>,
    /// Run metadata.
    pub meta: RunMeta,
    /// Which file names the outputs show (a view setting, not saved).
    pub file_names: FileNames,
}

impl Profile {
    /// An empty profile.
    pub fn new(meta: RunMeta) -> Self {
        Profile {
            meta,
            ..Profile::default()
        }
    }

    /// Interns a frame.
    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        if let Some(i) = self.frame_ids.find(&self.frames, |f| f, &frame) {
            return FrameId(i);
        }
        let id = FrameId(u32::try_from(self.frames.len()).expect("more than 4G unique frames"));
        self.frames.push(frame);
        self.frame_ids.insert(&self.frames, |f| f, id.0);
        id
    }

    /// Interns a stack given root first.
    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        let stored = self.stored(frames);
        if let Some(i) = self.stack_ids.find(&self.stacks, |s| s, &stored) {
            return StackId(i);
        }
        let id = StackId(u32::try_from(self.stacks.len()).expect("more than 4G unique stacks"));
        self.stacks.push(stored);
        self.stack_ids.insert(&self.stacks, |s| s, id.0);
        id
    }

    /// `frames` as stored: its first frame and its interned tail.
    fn stored(&mut self, frames: &[FrameId]) -> Stored {
        let (head, rest) = match frames.split_first() {
            Some((h, rest)) => (Some(*h), rest),
            None => (None, frames),
        };
        let tail = if let Some(t) = self.tail_ids.find(&self.tails, |t| &**t, rest) {
            t
        } else {
            let t = u32::try_from(self.tails.len()).expect("more than 4G unique stacks");
            self.tails.push(rest.into());
            self.tail_ids.insert(&self.tails, |t| &**t, t);
            t
        };
        Stored { head, tail }
    }

    /// Interns a process or thread name.
    pub fn intern_name(&mut self, name: &str) -> NameId {
        if let Some(i) = self.name_ids.find(&self.names, |n| &**n, name) {
            return NameId(i);
        }
        let id = NameId(u32::try_from(self.names.len()).expect("more than 4G unique names"));
        self.names.push(name.into());
        self.name_ids.insert(&self.names, |n| &**n, id.0);
        id
    }

    /// Counts one sample under its key (and keeps it, when the profile keeps a timeline).
    pub fn add(&mut self, sample: &Sample) {
        let i = if let Some(i) = self.count_ids.find(&self.counts, |c| &c.0, &sample.key) {
            i as usize
        } else {
            let i = self.counts.len();
            let id = u32::try_from(i).expect("more than 4G sample keys");
            self.counts.push((sample.key, Counts::default()));
            self.count_ids.insert(&self.counts, |c| &c.0, id);
            self.pids.insert(sample.key.pid);
            i
        };
        self.counts[i].1.add(sample.weight);
        self.totals.add(sample.weight);
        if let Some(t) = self.timeline.as_mut() {
            t.push(*sample);
        }
    }

    /// Adds a sample given with its names (tests); returns it as added.
    #[cfg(test)]
    #[allow(
        clippy::needless_pass_by_value,
        reason = "tests hand over struct literals"
    )]
    pub(crate) fn add_sample(&mut self, s: super::NamedSample) -> Sample {
        let sample = Sample {
            key: SampleKey {
                stack: s.stack,
                pid: s.pid,
                tid: s.tid,
                comm: self.intern_name(&s.comm),
                thread: self.intern_name(&s.thread_name),
                gil: s.gil,
                state: s.state,
            },
            time_ns: s.time_ns,
            cpu: s.cpu,
            weight: s.weight,
        };
        self.add(&sample);
        sample
    }

    /// The counts by key, in the order the keys were first seen.
    pub fn counts(&self) -> &[(SampleKey, Counts)] {
        &self.counts
    }

    /// Takes the counts so far, keeping the interned frames, stacks and names (their ids stay
    /// valid): a live view (`top`) takes each window's counts and stays bounded in memory.
    pub fn take_counts(&mut self) -> Vec<(SampleKey, Counts)> {
        self.count_ids.clear();
        self.pids.clear();
        self.totals = Counts::default();
        std::mem::take(&mut self.counts)
    }

    /// Samples counted.
    pub fn sample_count(&self) -> u64 {
        self.totals.samples
    }

    /// The samples' total weight (the number of samples for a run without `--idle`); what
    /// every share is a share of.
    pub fn total_weight(&self) -> u64 {
        self.totals.weight
    }

    /// Keep every sample added from now on, in order ([`Self::timeline`]).
    pub fn keep_timeline(&mut self) {
        self.timeline.get_or_insert_with(Vec::new);
    }

    /// The samples one by one, in order, if kept.
    pub fn timeline(&self) -> Option<&[Sample]> {
        self.timeline.as_deref()
    }

    /// The frame behind an id.
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id.0 as usize]
    }

    /// All interned frames, indexable by `FrameId.0`.
    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The frames of a stack, root first.
    pub fn stack(&self, id: StackId) -> Vec<FrameId> {
        let s = self.stacks[id.0 as usize];
        let tail = &self.tails[s.tail as usize];
        let mut out = Vec::with_capacity(tail.len() + 1);
        out.extend(s.head);
        out.extend_from_slice(tail);
        out
    }

    /// The depth of a stack, `None` when there is no such stack.
    pub fn stack_len(&self, id: StackId) -> Option<usize> {
        let s = self.stacks.get(id.0 as usize)?;
        Some(usize::from(s.head.is_some()) + self.tails[s.tail as usize].len())
    }

    /// Number of interned stacks (their ids are `0..`).
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// Every stack, whole, in id order (tests).
    #[cfg(test)]
    pub(crate) fn stacks(&self) -> Vec<Box<[FrameId]>> {
        (0..self.stacks.len())
            .map(|i| self.stack(StackId(i as u32)).into())
            .collect()
    }

    /// The name behind an id.
    pub fn name(&self, id: NameId) -> &Arc<str> {
        &self.names[id.0 as usize]
    }

    /// A key's process name.
    pub fn comm(&self, key: &SampleKey) -> &Arc<str> {
        self.name(key.comm)
    }

    /// A key's thread name.
    pub fn thread(&self, key: &SampleKey) -> &Arc<str> {
        self.name(key.thread)
    }

    /// Appends `frame` under the next id (a saved file's frame, in order): unlike
    /// [`Self::intern_frame`] a frame equal to an earlier one is refused, since ids must stay
    /// the file's.
    pub fn push_frame(&mut self, frame: Frame) -> Result<FrameId, PartsError> {
        let i = self.frames.len();
        let id = FrameId(u32::try_from(i).map_err(|_| PartsError::TooMany)?);
        if self.frame_ids.find(&self.frames, |f| f, &frame).is_some() {
            return Err(PartsError::DuplicateFrame { frame: i });
        }
        self.frames.push(frame);
        self.frame_ids.insert(&self.frames, |f| f, id.0);
        Ok(id)
    }

    /// Appends a stack (root first) under the next id, as [`Self::push_frame`] does frames;
    /// every frame it names must exist.
    pub fn push_stack(&mut self, frames: &[FrameId]) -> Result<StackId, PartsError> {
        let i = self.stacks.len();
        let id = StackId(u32::try_from(i).map_err(|_| PartsError::TooMany)?);
        if let Some(f) = frames.iter().find(|f| f.0 as usize >= self.frames.len()) {
            return Err(PartsError::FrameOutOfRange {
                stack: i,
                frame: f.0,
                frames: self.frames.len(),
            });
        }
        let stored = self.stored(frames);
        if self.stack_ids.find(&self.stacks, |s| s, &stored).is_some() {
            return Err(PartsError::DuplicateStack { stack: i });
        }
        self.stacks.push(stored);
        self.stack_ids.insert(&self.stacks, |s| s, id.0);
        Ok(id)
    }

    /// A profile with these frames and stacks (as [`Profile::frames`] and [`Profile::stack`]
    /// return them: a saved file), keeping every id: frame `i` gets `FrameId(i)`, stack `i`
    /// `StackId(i)`, and no sample yet (see [`Self::push_frame`], [`Self::push_stack`]).
    pub fn from_parts(
        meta: RunMeta,
        frames: Vec<Frame>,
        stacks: Vec<Box<[FrameId]>>,
    ) -> Result<Profile, PartsError> {
        let mut p = Profile::new(meta);
        for f in frames {
            p.push_frame(f)?;
        }
        for s in stacks {
            p.push_stack(&s)?;
        }
        Ok(p)
    }

    /// Sample weight per stack, in first-seen order of the stacks.
    pub fn stack_counts(&self) -> Vec<(StackId, u64)> {
        let mut counts = vec![0u64; self.stacks.len()];
        for (k, c) in &self.counts {
            counts[k.stack.0 as usize] += c.weight;
        }
        counts
            .into_iter()
            .enumerate()
            .filter(|(_, c)| *c > 0)
            .map(|(i, c)| (StackId(i as u32), c))
            .collect()
    }

    /// How many frames, stacks, names and sample keys are interned (each indexed once), and
    /// how many distinct stack tails the stacks share: what the profile holds (memory checks).
    pub fn sizes(&self) -> [usize; 5] {
        debug_assert_eq!(
            [
                self.frame_ids.len(),
                self.stack_ids.len(),
                self.name_ids.len(),
                self.count_ids.len(),
                self.tail_ids.len(),
            ],
            [
                self.frames.len(),
                self.stacks.len(),
                self.names.len(),
                self.counts.len(),
                self.tails.len(),
            ]
        );
        [
            self.frames.len(),
            self.stacks.len(),
            self.names.len(),
            self.counts.len(),
            self.tails.len(),
        ]
    }

    /// Number of distinct processes with samples.
    pub fn process_count(&self) -> usize {
        self.pids.len()
    }

    /// Folded-stack lines (`a;b;c count`), sorted, as FlameGraph's stackcollapse tools print.
    /// `;` inside a label is replaced by `:` and line breaks by spaces, so every line parses.
    pub fn folded_lines(&self) -> Vec<String> {
        let mut agg: BTreeMap<String, u64> = BTreeMap::new();
        for (sid, count) in self.stack_counts() {
            let key = self
                .stack(sid)
                .iter()
                .map(|f| sanitize_label(&self.frame(*f).label_as(self.file_names)))
                .collect::<Vec<_>>()
                .join(";");
            *agg.entry(key).or_default() += count;
        }
        agg.into_iter().map(|(k, c)| format!("{k} {c}")).collect()
    }
}

/// Why [`Profile::from_parts`] refused its parts. Displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartsError {
    /// More frames or stacks than a 32-bit id can name.
    #[error("more than 2^32 frames or stacks")]
    TooMany,
    /// A frame equal to an earlier one.
    #[error("frame {frame} is a duplicate of an earlier frame")]
    DuplicateFrame {
        /// Its index.
        frame: usize,
    },
    /// A stack equal to an earlier one.
    #[error("stack {stack} is a duplicate of an earlier stack")]
    DuplicateStack {
        /// Its index.
        stack: usize,
    },
    /// A stack names a frame that does not exist.
    #[error("stack {stack} refers to frame {frame}, but there are {frames} frames")]
    FrameOutOfRange {
        /// The stack's index.
        stack: usize,
        /// The frame id it names.
        frame: u32,
        /// Number of frames.
        frames: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::super::{FrameKind, GilState, ThreadState};
    use super::*;

    fn sample(p: &mut Profile, names: &[&str], pid: u32) -> Sample {
        let ids: Vec<FrameId> = names
            .iter()
            .map(|n| p.intern_frame(Frame::new(FrameKind::Native, *n)))
            .collect();
        let stack = p.intern_stack(&ids);
        let comm = p.intern_name("x");
        let s = Sample {
            key: SampleKey {
                stack,
                pid,
                tid: pid,
                comm,
                thread: comm,
                gil: GilState::Unknown,
                state: ThreadState::OnCpu,
            },
            time_ns: 0,
            cpu: 0,
            weight: 1,
        };
        p.add(&s);
        s
    }

    #[test]
    fn stacks_share_their_tails_and_read_back_whole() {
        let mut p = Profile::default();
        let code: Vec<FrameId> = ["main", "run", "work"]
            .iter()
            .map(|n| p.intern_frame(Frame::new(FrameKind::Python, *n)))
            .collect();
        // 100 processes running the same code: one tail, 100 stacks.
        for pid in 0..100 {
            let root = p.intern_frame(Frame::new(FrameKind::Process, format!("py ({pid})")));
            let mut stack = vec![root];
            stack.extend(&code);
            let id = p.intern_stack(&stack);
            assert_eq!(p.stack(id), stack);
            assert_eq!(p.stack_len(id), Some(4));
            assert_eq!(p.intern_stack(&stack), id, "interned once");
        }
        assert_eq!(p.sizes(), [103, 100, 0, 0, 1]);
        let empty = p.intern_stack(&[]);
        assert_eq!((p.stack(empty), p.stack_len(empty)), (vec![], Some(0)));
        let one = p.intern_stack(&code[..1]);
        assert_eq!(p.stack(one), &code[..1]);
        assert_ne!(one, empty, "a one-frame stack is not the empty one");
        assert_eq!(p.stack_len(StackId(102)), None);
        assert_eq!(p.stack_count(), 102);
    }

    #[test]
    fn samples_are_counted_by_key_with_interned_frames_and_stacks() {
        let mut p = Profile::default();
        sample(&mut p, &["a", "b"], 1);
        sample(&mut p, &["a", "b"], 1);
        sample(&mut p, &["a", "c"], 2);
        assert_eq!(p.frames().len(), 3);
        assert_eq!(p.names.len(), 1);
        assert_eq!(p.counts().len(), 2, "one entry per key, not per sample");
        assert_eq!(
            p.counts()[0].1,
            Counts {
                samples: 2,
                weight: 2
            }
        );
        assert_eq!(p.stack_counts(), vec![(StackId(0), 2), (StackId(1), 1)]);
        assert_eq!((p.sample_count(), p.total_weight()), (3, 3));
        assert_eq!(p.process_count(), 2);
        assert_eq!(
            p.folded_lines(),
            vec!["a;b 2".to_string(), "a;c 1".to_string()]
        );
        assert!(p.timeline().is_none(), "no timeline unless asked");
        // Weights count, samples too.
        let mut heavy = sample(&mut p, &["a", "c"], 2);
        heavy.weight = 5;
        p.add(&heavy);
        assert_eq!(
            p.counts()[1].1,
            Counts {
                samples: 3,
                weight: 7
            }
        );
    }

    #[test]
    fn from_parts_keeps_ids_and_checks_indices() {
        let mut orig = Profile::default();
        orig.keep_timeline();
        sample(&mut orig, &["a", "b"], 1);
        sample(&mut orig, &["a", "c"], 2);
        let parts = || (orig.meta.clone(), orig.frames().to_vec(), orig.stacks());
        let (meta, frames, stacks) = parts();
        let mut copy = Profile::from_parts(meta, frames, stacks).unwrap();
        for s in orig.timeline().unwrap() {
            copy.add(s);
        }
        assert_eq!(copy.frames(), orig.frames());
        assert_eq!(copy.stacks(), orig.stacks());
        assert_eq!(copy.counts(), orig.counts());
        assert_eq!(copy.folded_lines(), orig.folded_lines());

        let (meta, mut frames, stacks) = parts();
        frames[2] = frames[0].clone();
        assert_eq!(
            Profile::from_parts(meta, frames, stacks).unwrap_err(),
            PartsError::DuplicateFrame { frame: 2 }
        );
        let (meta, frames, mut stacks) = parts();
        stacks[1] = vec![FrameId(0), FrameId(3)].into();
        assert_eq!(
            Profile::from_parts(meta, frames, stacks).unwrap_err(),
            PartsError::FrameOutOfRange {
                stack: 1,
                frame: 3,
                frames: 3
            }
        );
        let (meta, frames, mut stacks) = parts();
        stacks[1] = stacks[0].clone();
        assert_eq!(
            Profile::from_parts(meta, frames, stacks).unwrap_err(),
            PartsError::DuplicateStack { stack: 1 }
        );
    }

    #[test]
    fn take_counts_keeps_interned_ids() {
        let mut p = Profile::default();
        let first = sample(&mut p, &["a", "b"], 1);
        let taken = p.take_counts();
        assert_eq!(taken.len(), 1);
        assert!(p.counts().is_empty());
        assert_eq!(p.sample_count(), 0);
        let again = sample(&mut p, &["a", "b"], 1);
        assert_eq!(again.key, first.key);
        assert_eq!(p.frames().len(), 2);
    }
}
