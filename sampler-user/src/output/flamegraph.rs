//! SVG flame graph via inferno, from the folded stacks of the profile. With `record --idle`
//! each off-CPU stack ends in its state as a frame of its own (`[off-CPU: sleeping in futex]`),
//! so the graph shows where threads wait above the Python frame that waits.
//!
//! Readability rules (issue 17):
//! - Palettes by frame kind, so the eye finds the boundaries: Python frames blue, native
//!   frames yellow to orange, kernel frames red, processes and threads grey-green, markers
//!   (`[truncated]`, `[merge mismatch]`, …) grey. Each name keeps one colour (a hash of it
//!   picks the shade inside its kind's range).
//! - Narrow boxes show the start of their label (the function), not the end of the path.
//! - The height follows the depth of the stacks, not of the deepest one: stacks deeper than
//!   the depth that all but [`DEEP_SHARE`] of the samples (at least one sample) stay within are
//!   cut there and end in [`DEEPER_MARKER`], so that one odd sample cannot make the graph
//!   thousands of pixels tall with its first screen blank. The subtitle says how many were cut;
//!   the other formats keep every frame.

use std::collections::BTreeMap;
use std::io::{self, Write};

use inferno::flamegraph::color::{Color, PaletteMap};

use super::Renderer;
use crate::profile::{FrameKind, Profile, sanitize_label};

/// Flame-graph renderer.
pub struct Flamegraph;

/// Share of the samples that may be deeper than the depth the graph shows in full.
pub const DEEP_SHARE: f64 = 0.001;
/// The frame that ends a stack cut at the shown depth.
pub const DEEPER_MARKER: &str = "[deeper frames not shown]";

impl Renderer for Flamegraph {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let (lines, cut) = capped_lines(profile);
        let mut palette = palette(profile);
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = "pyebpf".to_string();
        let m = &profile.meta;
        let mut subtitle = format!(
            "{} samples{}, {:.1} s at {} Hz on {} CPUs, {} processes, {} lost",
            profile.total_weight(),
            if m.idle {
                " (wall clock: on and off CPU)"
            } else {
                ""
            },
            m.duration_s,
            m.rate_hz,
            m.cpus,
            profile.process_count(),
            m.lost_samples
        );
        if let Some((depth, samples)) = cut {
            use std::fmt::Write as _;
            let _ = write!(
                subtitle,
                "; {samples} samples deeper than {depth} frames cut there"
            );
        }
        opts.subtitle = Some(subtitle);
        opts.count_name = "samples".to_string();
        opts.text_truncate_direction = inferno::flamegraph::TextTruncateDirection::Right;
        // Every label is in the map; inferno's own choice (by name hash) is only a fallback.
        opts.hash = true;
        opts.deterministic = true;
        opts.palette_map = Some(&mut palette);
        if lines.is_empty() {
            // inferno refuses empty input; an empty run still gets a valid SVG.
            return write!(
                out,
                r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="1200" height="60" xmlns="http://www.w3.org/2000/svg"><text x="600" y="30" text-anchor="middle">pyebpf: no samples</text></svg>"#
            );
        }
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)
            .map_err(|e| io::Error::other(format!("flame graph: {e}")))
    }
}

/// The folded lines with stacks deeper than the shown depth cut, and (depth, samples cut).
fn capped_lines(profile: &Profile) -> (Vec<String>, Option<(usize, u64)>) {
    let counts = profile.stack_counts();
    let mut by_depth: BTreeMap<usize, u64> = BTreeMap::new();
    for &(sid, n) in &counts {
        *by_depth
            .entry(profile.stack_len(sid).unwrap_or(0))
            .or_default() += n;
    }
    let total: u64 = by_depth.values().sum();
    let Some(depth) = shown_depth(&by_depth, total) else {
        return (profile.folded_lines(), None);
    };
    let mut agg: BTreeMap<String, u64> = BTreeMap::new();
    let mut cut = 0;
    for (sid, n) in counts {
        let stack = profile.stack(sid);
        let mut labels: Vec<String> = stack
            .iter()
            .take(depth)
            .map(|f| sanitize_label(&profile.frame(*f).label_as(profile.file_names)))
            .collect();
        if stack.len() > depth {
            labels.push(DEEPER_MARKER.to_string());
            cut += n;
        }
        *agg.entry(labels.join(";")).or_default() += n;
    }
    let lines = agg.into_iter().map(|(k, c)| format!("{k} {c}")).collect();
    (lines, Some((depth, cut)))
}

/// The depth shown in full: the smallest one that all but [`DEEP_SHARE`] of the `total`
/// samples (at least one) stay within, when cutting there saves height (the cut stacks take
/// one level more for the marker); `None` when every stack is shown whole.
fn shown_depth(by_depth: &BTreeMap<usize, u64>, total: u64) -> Option<usize> {
    let max = *by_depth.keys().next_back()?;
    let allowance = ((total as f64 * DEEP_SHARE) as u64).max(1);
    let mut deeper = total;
    for (&depth, &n) in by_depth {
        deeper -= n;
        if deeper <= allowance {
            return (max > depth + 1).then_some(depth);
        }
    }
    None
}

/// A colour for every label of the profile, by the kind of its frame.
fn palette(profile: &Profile) -> PaletteMap {
    let mut map = PaletteMap::default();
    for f in profile.frames() {
        let label = sanitize_label(&f.label_as(profile.file_names));
        let color = kind_color(f.kind, &label);
        map.insert(label, color);
    }
    map.insert(DEEPER_MARKER, kind_color(FrameKind::Marker, DEEPER_MARKER));
    map
}

/// The colour of a frame of `kind` named `label`: a shade of its kind's range picked by a hash
/// of the label (FNV-1a: the same in every run and build).
pub fn kind_color(kind: FrameKind, label: &str) -> Color {
    let hash = label.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let v = (hash % 1000) as f32 / 1000.0;
    let shade = |lo: u8, hi: u8| lo + (f32::from(hi - lo) * v) as u8;
    let (r, g, b) = match kind {
        FrameKind::Python => (shade(60, 110), shade(130, 190), shade(205, 250)),
        FrameKind::Native => (shade(215, 245), shade(160, 215), shade(40, 80)),
        FrameKind::Kernel => (shade(210, 240), shade(70, 115), shade(60, 95)),
        FrameKind::Process | FrameKind::Thread => {
            (shade(150, 175), shade(175, 200), shade(150, 170))
        }
        FrameKind::Marker => (shade(170, 190), shade(170, 190), shade(170, 190)),
        FrameKind::State => (shade(150, 180), shade(120, 150), shade(200, 230)),
    };
    Color { r, g, b }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, GilState, NamedSample};

    #[test]
    fn svg_contains_frames() {
        let p = crate::output::tests::demo_profile();
        let mut buf = Vec::new();
        Flamegraph.render(&p, &mut buf).unwrap();
        let svg = String::from_utf8(buf).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("hot"));
        assert!(svg.contains("app (10)"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn empty_profile_is_valid_svg() {
        let p = Profile::default();
        let mut buf = Vec::new();
        Flamegraph.render(&p, &mut buf).unwrap();
        assert!(String::from_utf8(buf).unwrap().ends_with("</svg>"));
    }

    /// `n` samples of one stack `depth` frames deep (a root, then `f0`, `f1`, …).
    fn add(p: &mut Profile, depth: usize, n: usize, kind: FrameKind) {
        let mut ids = vec![p.intern_frame(Frame::new(FrameKind::Process, "app (1)"))];
        for i in 1..depth {
            ids.push(p.intern_frame(Frame::new(kind, format!("f{i}"))));
        }
        let stack = p.intern_stack(&ids);
        for _ in 0..n {
            p.add_sample(NamedSample {
                stack,
                time_ns: 0,
                pid: 1,
                tid: 1,
                cpu: 0,
                comm: "app".into(),
                thread_name: "app".into(),
                gil: GilState::Unknown,
                state: crate::profile::ThreadState::OnCpu,
                weight: 1,
            });
        }
    }

    /// The SVG's `height` attribute.
    fn height(p: &Profile) -> u64 {
        let mut buf = Vec::new();
        Flamegraph.render(p, &mut buf).unwrap();
        let svg = String::from_utf8(buf).unwrap();
        let at = svg.find("height=\"").unwrap() + 8;
        svg[at..at + svg[at..].find('"').unwrap()].parse().unwrap()
    }

    /// One sample 258 frames deep among 1000 of depth ≤ 40: the graph is as tall as the 40
    /// need (plus the marker's level), and the deep sample ends in the marker at that depth.
    #[test]
    fn one_deep_sample_cannot_stretch_the_height() {
        let mut normal = Profile::default();
        add(&mut normal, 40, 600, FrameKind::Python);
        add(&mut normal, 25, 400, FrameKind::Python);
        let base = height(&normal);
        let mut odd = Profile::default();
        add(&mut odd, 40, 600, FrameKind::Python);
        add(&mut odd, 25, 399, FrameKind::Python);
        add(&mut odd, 258, 1, FrameKind::Python);
        let h = height(&odd);
        assert!(h <= base + 16, "{h} px against {base} px");
        let (lines, cut) = capped_lines(&odd);
        assert_eq!(cut, Some((40, 1)));
        let deep = lines.iter().find(|l| l.contains(DEEPER_MARKER)).unwrap();
        assert_eq!(deep.split(';').count(), 41, "{deep}");
        assert!(deep.ends_with(&format!("{DEEPER_MARKER} 1")));
        // Stacks of real, common depth are never cut: 0.3 % of the samples are deep.
        let mut deep_real = Profile::default();
        add(&mut deep_real, 40, 997, FrameKind::Python);
        add(&mut deep_real, 120, 3, FrameKind::Python);
        assert_eq!(capped_lines(&deep_real).1, None);
        assert!(height(&deep_real) > base + 16 * 70);
    }

    #[test]
    fn shown_depth_saves_height_or_is_none() {
        let m = |v: &[(usize, u64)]| v.iter().copied().collect::<BTreeMap<_, _>>();
        // The deepest level holds one sample, but cutting it would need a level anyway.
        assert_eq!(shown_depth(&m(&[(10, 999), (11, 1)]), 1000), None);
        assert_eq!(shown_depth(&m(&[(10, 999), (30, 1)]), 1000), Some(10));
        assert_eq!(shown_depth(&m(&[(10, 998), (30, 2)]), 1000), None);
        // 10 000 samples: ten may be deeper.
        assert_eq!(shown_depth(&m(&[(10, 9990), (30, 10)]), 10_000), Some(10));
        assert_eq!(shown_depth(&BTreeMap::new(), 0), None);
    }

    /// Python, native and kernel frames get colours from distinct ranges; a name keeps its
    /// colour; narrow boxes keep the start of the label.
    #[test]
    fn palettes_by_kind_and_labels_cut_on_the_right() {
        for name in ["spin (app.py:3)", "main", "x", "_PyEval_EvalFrameDefault"] {
            let py = kind_color(FrameKind::Python, name);
            let native = kind_color(FrameKind::Native, name);
            let kernel = kind_color(FrameKind::Kernel, name);
            assert!(py.b > py.r && py.b > 200, "{py:?}");
            assert!(
                native.r > 210 && native.g > 150 && native.b < 81,
                "{native:?}"
            );
            assert!(kernel.r > 205 && kernel.g < 116, "{kernel:?}");
            assert_eq!(py, kind_color(FrameKind::Python, name));
        }
        let mut p = Profile::default();
        add(&mut p, 3, 1, FrameKind::Native);
        let mut buf = Vec::new();
        Flamegraph.render(&p, &mut buf).unwrap();
        let svg = String::from_utf8(buf).unwrap();
        assert!(
            svg.contains("truncate_text_right = true"),
            "inferno's script option"
        );
        let c = kind_color(FrameKind::Native, "f1");
        assert!(
            svg.contains(&format!("rgb({},{},{})", c.r, c.g, c.b)),
            "the native frame's colour is used"
        );
    }
}
