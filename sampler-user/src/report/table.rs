//! The rows of a report: samples (after the filters) grouped by the key tuple, with self and
//! children counts, sorted, cut at the percent limit, and each shown row's call tree.
//!
//! Self: each sample counts once, for the key tuple of its leaf (the last frame that is not a
//! synthetic Process/Thread frame; a stack without one has the "unknown" frame values).
//! Children (perf `--children`): each sample counts once for every distinct key tuple of any
//! frame of its stack. Samples are first grouped by (stack, the sample values the keys use), so
//! the work per frame is done once per distinct group, not once per sample.
//!
//! Call trees (`-g`), one per shown row, built from the stacks through the row:
//! - without `--children` the row's frame is the leaf: `caller` inserts the stack root first
//!   (root → … → leaf), `callee` leaf first (leaf → its callers → root);
//! - with `--children` the row's frame is the outermost frame of the stack with the row's key:
//!   `caller` inserts from it down to the leaf (what the row calls, as perf shows children
//!   entries), `callee` from it up to the root.
//!
//! Paths are cut after [`MAX_GRAPH_DEPTH`] frames.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::keys::{FrameTable, Part, SampleParts, tuple};
use super::options::{CallOrder, Config};
use crate::profile::{FrameId, FrameKind, Profile, StackId};

/// Deepest call-tree path kept.
pub const MAX_GRAPH_DEPTH: usize = 512;

/// One row.
#[derive(Clone, Debug)]
pub struct Row {
    /// Key values in `--sort` order.
    pub key: Box<[Part]>,
    /// Samples whose leaf has this key.
    pub self_samples: u64,
    /// Samples with a frame of this key anywhere (with `--children`; else equal to self).
    pub children: u64,
    /// The call tree (`-g`).
    pub graph: Option<Tree>,
}

/// The report's numbers.
#[derive(Debug)]
pub struct Table {
    /// Samples of the profile.
    pub all_samples: u64,
    /// Samples that passed the filters (the 100 % of every percentage).
    pub total: u64,
    /// Shown rows, best first.
    pub rows: Vec<Row>,
    /// Rows hidden by the percent limit.
    pub hidden: usize,
}

impl Table {
    /// `n` as a percentage of the total (0 for an empty total).
    pub fn percent(&self, n: u64) -> f64 {
        percent(n, self.total)
    }
}

/// `n` as a percentage of `total` (0 when `total` is 0).
pub fn percent(n: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        n as f64 * 100.0 / total as f64
    }
}

/// A call tree: node 0 is a virtual root whose children are the top frames.
#[derive(Clone, Debug)]
pub struct Tree {
    nodes: Vec<Node>,
    index: HashMap<(usize, FrameId), usize>,
}

/// One call-tree node.
#[derive(Clone, Debug)]
pub struct Node {
    /// The frame (meaningless for the virtual root).
    pub frame: FrameId,
    /// Samples through this node.
    pub count: u64,
    /// Child node indexes, best first once the tree is finished.
    pub children: Vec<usize>,
}

impl Tree {
    fn new() -> Tree {
        Tree {
            nodes: vec![Node {
                frame: FrameId(u32::MAX),
                count: 0,
                children: Vec::new(),
            }],
            index: HashMap::new(),
        }
    }

    /// Adds one path (top frame first) seen `count` times.
    fn insert(&mut self, path: impl Iterator<Item = FrameId>, count: u64) {
        let mut at = 0;
        self.nodes[0].count += count;
        for frame in path.take(MAX_GRAPH_DEPTH) {
            let next = if let Some(&i) = self.index.get(&(at, frame)) {
                i
            } else {
                let i = self.nodes.len();
                self.nodes.push(Node {
                    frame,
                    count: 0,
                    children: Vec::new(),
                });
                self.nodes[at].children.push(i);
                self.index.insert((at, frame), i);
                i
            };
            self.nodes[next].count += count;
            at = next;
        }
    }

    /// Orders every node's children by count (descending), then label, then frame id.
    fn finish(&mut self, profile: &Profile) {
        let labels: HashMap<FrameId, String> = self
            .nodes
            .iter()
            .skip(1)
            .map(|n| (n.frame, label(profile, n.frame)))
            .collect();
        for i in 0..self.nodes.len() {
            let mut children = std::mem::take(&mut self.nodes[i].children);
            children.sort_by(|&a, &b| {
                let (na, nb) = (&self.nodes[a], &self.nodes[b]);
                nb.count
                    .cmp(&na.count)
                    .then_with(|| labels[&na.frame].cmp(&labels[&nb.frame]))
                    .then_with(|| na.frame.cmp(&nb.frame))
            });
            self.nodes[i].children = children;
        }
        self.index = HashMap::new();
    }

    /// The virtual root (its count is the row's count).
    pub fn root(&self) -> &Node {
        &self.nodes[0]
    }

    /// A node by index.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }
}

/// The label of a frame in a call tree: the flame-graph label.
pub fn label(profile: &Profile, id: FrameId) -> String {
    profile
        .frames()
        .get(id.0 as usize)
        .map_or_else(|| "[unknown]".to_string(), crate::profile::Frame::label)
}

/// Whether a frame is synthetic (Process, Thread, the State ending an off-CPU stack) or
/// unknown.
fn synthetic(profile: &Profile, id: FrameId) -> bool {
    profile.frames().get(id.0 as usize).is_none_or(|f| {
        matches!(
            f.kind,
            FrameKind::Process | FrameKind::Thread | FrameKind::State
        )
    })
}

/// Samples grouped by (stack, the sample values the keys use).
fn groups(profile: &Profile, cfg: &Config) -> (u64, HashMap<(StackId, SampleParts), u64>) {
    let empty: Arc<str> = "".into();
    let mut out: HashMap<(StackId, SampleParts), u64> = HashMap::new();
    let mut total = 0;
    for (k, c) in profile.counts() {
        if !cfg.filter.accepts(profile, k) {
            continue;
        }
        total += c.weight;
        *out.entry((k.stack, SampleParts::of(profile, k, &cfg.keys, &empty)))
            .or_default() += c.weight;
    }
    (total, out)
}

/// Index of the leaf (last non-synthetic frame), if any.
fn leaf(profile: &Profile, stack: &[FrameId]) -> Option<usize> {
    stack.iter().rposition(|&f| !synthetic(profile, f))
}

/// The distinct key tuples of the frames of a stack, each with the index of its outermost
/// frame (the "unknown" tuple at the last frame when the stack has no real frame).
fn frame_tuples(
    profile: &Profile,
    cfg: &Config,
    frames: &FrameTable,
    stack: &[FrameId],
    parts: &SampleParts,
) -> Vec<(Box<[Part]>, usize)> {
    let mut out: Vec<(Box<[Part]>, usize)> = Vec::new();
    let mut seen: HashSet<Box<[Part]>> = HashSet::new();
    let mut scratch = Vec::with_capacity(cfg.keys.len());
    let only_sample_keys = !cfg.has_frame_key();
    for (i, &f) in stack.iter().enumerate() {
        if synthetic(profile, f) {
            continue;
        }
        let keys = frames.get(f.0 as usize).unwrap_or(frames.unknown());
        tuple(&cfg.keys, parts, keys, &mut scratch);
        if !seen.contains(scratch.as_slice()) {
            let key: Box<[Part]> = scratch.as_slice().into();
            seen.insert(key.clone());
            out.push((key, i));
        }
        if only_sample_keys {
            break;
        }
    }
    if out.is_empty() {
        tuple(&cfg.keys, parts, frames.unknown(), &mut scratch);
        out.push((scratch.as_slice().into(), stack.len().saturating_sub(1)));
    }
    out
}

/// Builds the table.
pub fn build(profile: &Profile, cfg: &Config) -> Table {
    let frames = FrameTable::new(profile, cfg.has_frame_key(), cfg.key_options);
    let (total, groups) = groups(profile, cfg);
    let mut rows: HashMap<Box<[Part]>, (u64, u64)> = HashMap::new();
    let mut scratch = Vec::with_capacity(cfg.keys.len());
    for ((sid, parts), &count) in &groups {
        let stack = profile.stack(*sid);
        let leaf_keys = leaf(profile, &stack)
            .and_then(|i| frames.get(stack[i].0 as usize))
            .unwrap_or(frames.unknown());
        tuple(&cfg.keys, parts, leaf_keys, &mut scratch);
        if let Some(r) = rows.get_mut(scratch.as_slice()) {
            r.0 += count;
        } else {
            rows.insert(scratch.as_slice().into(), (count, 0));
        }
        if cfg.children {
            for (t, _) in frame_tuples(profile, cfg, &frames, &stack, parts) {
                rows.entry(t).or_default().1 += count;
            }
        }
    }
    let mut rows: Vec<Row> = rows
        .into_iter()
        .map(|(key, (self_samples, children))| Row {
            key,
            self_samples,
            children: if cfg.children { children } else { self_samples },
            graph: None,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.children
            .cmp(&a.children)
            .then_with(|| b.self_samples.cmp(&a.self_samples))
            .then_with(|| a.key.cmp(&b.key))
    });
    let before = rows.len();
    if cfg.percent_limit > 0.0 {
        rows.retain(|r| percent(r.children, total) >= cfg.percent_limit);
    }
    let mut table = Table {
        all_samples: profile.total_weight(),
        total,
        hidden: before - rows.len(),
        rows,
    };
    if let Some(order) = cfg.call_graph {
        add_graphs(profile, cfg, &frames, &groups, order, &mut table);
    }
    table
}

/// Builds the call tree of every shown row.
fn add_graphs(
    profile: &Profile,
    cfg: &Config,
    frames: &FrameTable,
    groups: &HashMap<(StackId, SampleParts), u64>,
    order: CallOrder,
    table: &mut Table,
) {
    let index: HashMap<Box<[Part]>, usize> = table
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.key.clone(), i))
        .collect();
    let mut trees: Vec<Tree> = (0..table.rows.len()).map(|_| Tree::new()).collect();
    let mut scratch = Vec::with_capacity(cfg.keys.len());
    for ((sid, parts), &count) in groups {
        let stack = profile.stack(*sid);
        if stack.is_empty() {
            continue;
        }
        if cfg.children {
            for (t, at) in frame_tuples(profile, cfg, frames, &stack, parts) {
                if let Some(&row) = index.get(&t) {
                    let tree = &mut trees[row];
                    match order {
                        CallOrder::Caller => tree.insert(stack[at..].iter().copied(), count),
                        CallOrder::Callee => {
                            tree.insert(stack[..=at].iter().rev().copied(), count);
                        }
                    }
                }
            }
        } else {
            let at = leaf(profile, &stack);
            let keys = at
                .and_then(|i| frames.get(stack[i].0 as usize))
                .unwrap_or(frames.unknown());
            tuple(&cfg.keys, parts, keys, &mut scratch);
            let Some(&row) = index.get(scratch.as_slice()) else {
                continue;
            };
            let at = at.unwrap_or(stack.len() - 1);
            let tree = &mut trees[row];
            match order {
                CallOrder::Caller => tree.insert(stack[..=at].iter().copied(), count),
                CallOrder::Callee => tree.insert(stack[..=at].iter().rev().copied(), count),
            }
        }
    }
    for (row, mut tree) in table.rows.iter_mut().zip(trees) {
        tree.finish(profile);
        row.graph = Some(tree);
    }
}
