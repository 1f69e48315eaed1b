//! `pyebpf report`: perf-report-style views of a saved profile.

pub mod script;

use std::io::{self, Write};

use crate::profile::Profile;

/// What `report` shows (from the CLI flags).
#[derive(Clone, Debug, Default)]
#[allow(clippy::struct_excessive_bools, reason = "one field per CLI flag")]
pub struct ReportOptions {
    /// `--sort` keys as typed (comma-separated lists already split).
    pub sort: Vec<String>,
    /// `--children`: total (inclusive) as well as self overhead.
    pub children: bool,
    /// `--percent-limit`: hide rows below this overhead, in percent.
    pub percent_limit: f64,
    /// `--pid` filter.
    pub pids: Vec<u32>,
    /// `--tid` filter.
    pub tids: Vec<u32>,
    /// `--comm` filter.
    pub comms: Vec<String>,
    /// `--thread` filter (thread names).
    pub threads: Vec<String>,
    /// `-g caller|callee`.
    pub call_graph: Option<String>,
    /// `--json`.
    pub json: bool,
    /// `--csv`.
    pub csv: bool,
    /// Colour (stdout is a terminal).
    pub color: bool,
}

/// Writes the report.
pub fn render(_profile: &Profile, _opts: &ReportOptions, _out: &mut dyn Write) -> io::Result<()> {
    Err(io::Error::other("report is not implemented yet"))
}
