//! Folded stacks (`root;…;leaf count`), the input format of FlameGraph and inferno.

use std::io::{self, Write};

use super::Renderer;
use crate::profile::Profile;

/// Folded-stack renderer.
pub struct Collapsed;

impl Renderer for Collapsed {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        for line in profile.folded_lines() {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_parses_and_counts_add_up() {
        let p = crate::output::tests::demo_profile();
        let mut buf = Vec::new();
        Collapsed.render(&p, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let mut total = 0;
        for line in text.lines() {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            total += count.parse::<u64>().unwrap();
            assert!(!stack.is_empty());
        }
        assert_eq!(total, p.total_weight());
        assert!(text.contains("app (10);main;hot 3"));
        assert!(text.contains("app (10);main;vfs_read_[k] 1"));
        assert!(text.contains("py (20);f<é:> (/x/y.py:3) 2"), "{text}");
    }
}
