//! Reading folded stacks: pyebpf's `-f collapsed` and py-spy's `-f raw` share the format
//! `frame;frame;… count`. Python frames are `name (file:line)` in both.
use std::path::Path;

use anyhow::{Context as _, Result};

pub struct Folded {
    lines: Vec<(String, u64)>,
}

impl Folded {
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(Self::parse(&text))
    }

    pub fn parse(text: &str) -> Self {
        let lines = text
            .lines()
            .filter_map(|l| {
                let (stack, count) = l.trim_end().rsplit_once(' ')?;
                Some((stack.to_owned(), count.parse().ok()?))
            })
            .collect();
        Self { lines }
    }

    /// Samples whose stack has a frame named `name` (inclusive attribution).
    pub fn containing(&self, name: &str) -> u64 {
        self.lines
            .iter()
            .filter(|(s, _)| s.split(';').any(|f| has_ident(f, name)))
            .map(|(_, n)| n)
            .sum()
    }

    /// Samples whose stack has a frame named any of `names`.
    pub fn containing_any(&self, names: &[&str]) -> u64 {
        self.lines
            .iter()
            .filter(|(s, _)| s.split(';').any(|f| names.iter().any(|n| has_ident(f, n))))
            .map(|(_, n)| n)
            .sum()
    }

    /// The lowest `bslot_NNNNN` marker anywhere (function or thread name; see slots.py).
    pub fn first_slot(&self) -> Option<u32> {
        self.lines
            .iter()
            .filter_map(|(s, _)| slot_markers(s).min())
            .min()
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` contains `name` as a whole identifier (not as part of a longer one).
fn has_ident(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

fn slot_markers(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.match_indices("bslot_").filter_map(|(i, _)| {
        if text[..i].chars().next_back().is_some_and(is_ident) {
            return None;
        }
        let digits = text.get(i + 6..i + 11)?;
        let after = text[i + 11..].chars().next();
        if after.is_some_and(is_ident) {
            return None;
        }
        digits.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribution_and_markers() {
        let f = Folded::parse(
            "python3.13 (10);bslot_00042 (11);bslot_00042 (slots.py:20) 3\n\
             <module> (split.py:80);main (split.py:60);split_sixty (split.py:30) 6\n\
             main (split.py:60);split_sixty_x (split.py:9) 2\n\
             python3.13 (10);bslot_00007 (11) 1\n",
        );
        assert_eq!(f.containing("split_sixty"), 6);
        assert_eq!(f.containing_any(&["split_sixty", "split_sixty_x"]), 8);
        assert_eq!(f.first_slot(), Some(7));
        assert_eq!(Folded::parse("a;b 1\n").first_slot(), None);
    }
}
