//! SVG flame graph via inferno, from the folded stacks of the profile. With `record --idle`
//! each off-CPU stack ends in its state as a frame of its own (`[off-CPU: sleeping in futex]`),
//! so the graph shows where threads wait above the Python frame that waits.

use std::io::{self, Write};

use super::Renderer;
use crate::profile::Profile;

/// Flame-graph renderer.
pub struct Flamegraph;

impl Renderer for Flamegraph {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let lines = profile.folded_lines();
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = "pyebpf".to_string();
        let m = &profile.meta;
        opts.subtitle = Some(format!(
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
        ));
        opts.count_name = "samples".to_string();
        opts.hash = true;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
