//! `report` options, validated: the CLI's [`ReportOptions`] (strings as typed) become a typed
//! [`Config`] before any profile data is looked at, so every usage error is one line and
//! nothing is printed first.

use std::fmt;

use super::ReportOptions;
use super::keys::{KeyOptions, SortKey};
use crate::profile::{FileNames, Profile, SampleKey, ThreadState};

/// Order of the call chains printed under each row (`-g`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOrder {
    /// Outermost frame first (perf `-g caller`).
    Caller,
    /// The row's frame first, then its callers (perf `-g callee`).
    Callee,
}

/// Output style.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// perf-report-style text.
    Text,
    /// One JSON object.
    Json,
    /// CSV, one line per row.
    Csv,
}

/// Which samples count (each non-empty list must match; any entry of a list matches).
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// `--pid`.
    pub pids: Vec<u32>,
    /// `--tid`.
    pub tids: Vec<u32>,
    /// `--comm`.
    pub comms: Vec<String>,
    /// `--thread`.
    pub threads: Vec<String>,
    /// `--state`.
    pub states: Vec<ThreadState>,
}

impl Filter {
    /// Whether any filter is set.
    pub fn is_active(&self) -> bool {
        !(self.pids.is_empty()
            && self.tids.is_empty()
            && self.comms.is_empty()
            && self.threads.is_empty()
            && self.states.is_empty())
    }

    /// Whether the samples of `key` (in `profile`) pass.
    pub fn accepts(&self, profile: &Profile, key: &SampleKey) -> bool {
        (self.pids.is_empty() || self.pids.contains(&key.pid))
            && (self.tids.is_empty() || self.tids.contains(&key.tid))
            && (self.comms.is_empty() || self.comms.iter().any(|c| **c == **profile.comm(key)))
            && (self.threads.is_empty()
                || self.threads.iter().any(|t| **t == **profile.thread(key)))
            && (self.states.is_empty() || self.states.contains(&key.state))
    }
}

/// Default pruning of call-graph branches when `-g` is given without `--percent-limit` (perf's).
pub const DEFAULT_GRAPH_LIMIT: f64 = 0.5;

/// Validated `report` options.
#[derive(Clone, Debug)]
pub struct Config {
    /// Row keys, in the order given, without duplicates.
    pub keys: Vec<SortKey>,
    /// `--children`.
    pub children: bool,
    /// Rows under this percentage are hidden (0: none hidden).
    pub percent_limit: f64,
    /// Sample filters.
    pub filter: Filter,
    /// `-g`.
    pub call_graph: Option<CallOrder>,
    /// Call-graph branches under this percentage of their row are pruned.
    pub graph_limit: f64,
    /// Text, JSON or CSV.
    pub style: Style,
    /// Colour the overhead (text on a terminal only).
    pub color: bool,
    /// Shown as the source in the header.
    pub source: String,
    /// `--full-filenames`, `--addresses`.
    pub key_options: KeyOptions,
}

/// A usage error of `report`. Displays as one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionError(pub String);

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OptionError {}

/// Longest option value echoed back in an error message.
const MAX_ECHO: usize = 40;

/// `value` for an error message: control characters replaced, at most [`MAX_ECHO`] characters.
fn echo(value: &str) -> String {
    let mut s: String = value
        .chars()
        .take(MAX_ECHO)
        .map(|c| {
            if crate::printable::is_unsafe(c) {
                '?'
            } else {
                c
            }
        })
        .collect();
    if value.chars().count() > MAX_ECHO {
        s.push('…');
    }
    s
}

impl Config {
    /// Validates the CLI options.
    pub fn new(o: &ReportOptions) -> Result<Config, OptionError> {
        let mut keys = Vec::new();
        for raw in &o.sort {
            let name = raw.trim();
            if name.is_empty() {
                continue;
            }
            let key = SortKey::parse(name).ok_or_else(|| {
                OptionError(format!(
                    "unknown sort key '{}': use {}",
                    echo(name),
                    SortKey::valid_names()
                ))
            })?;
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return Err(OptionError(format!(
                "--sort needs at least one key: {}",
                SortKey::valid_names()
            )));
        }
        if !(0.0..=100.0).contains(&o.percent_limit) {
            return Err(OptionError(format!(
                "--percent-limit must be between 0 and 100, not {}",
                o.percent_limit
            )));
        }
        let call_graph = match o.call_graph.as_deref().map(str::trim) {
            None => None,
            Some("caller") => Some(CallOrder::Caller),
            Some("callee") => Some(CallOrder::Callee),
            Some(other) => {
                return Err(OptionError(format!(
                    "unknown call-graph order '{}': use caller or callee",
                    echo(other)
                )));
            }
        };
        let mut states = Vec::new();
        for raw in &o.states {
            let name = raw.trim();
            if name.is_empty() {
                continue;
            }
            let state = ThreadState::parse(name).ok_or_else(|| {
                OptionError(format!(
                    "unknown state '{}': use {}",
                    echo(name),
                    ThreadState::ALL.map(ThreadState::as_str).join(", ")
                ))
            })?;
            if !states.contains(&state) {
                states.push(state);
            }
        }
        let style = match (o.json, o.csv) {
            (true, true) => return Err(OptionError("--json and --csv exclude each other".into())),
            (true, false) => Style::Json,
            (false, true) => Style::Csv,
            (false, false) => Style::Text,
        };
        Ok(Config {
            keys,
            children: o.children,
            percent_limit: o.percent_limit,
            filter: Filter {
                pids: o.pids.clone(),
                tids: o.tids.clone(),
                comms: o.comms.clone(),
                threads: o.threads.clone(),
                states,
            },
            call_graph,
            graph_limit: if o.percent_limit > 0.0 {
                o.percent_limit
            } else {
                DEFAULT_GRAPH_LIMIT
            },
            style,
            color: o.color && style == Style::Text,
            source: o.source.clone(),
            key_options: KeyOptions {
                file_names: if o.full_filenames {
                    FileNames::Full
                } else {
                    FileNames::Short
                },
                addresses: o.addresses,
            },
        })
    }

    /// Whether any key is derived from the frames (module, function, srcline).
    pub fn has_frame_key(&self) -> bool {
        self.keys.iter().any(|k| k.is_frame_key())
    }
}
