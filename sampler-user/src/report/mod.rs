//! `pyebpf report`: perf-report-style views of a saved profile, and (`script`) every sample in
//! the `perf script` text layout.
//!
//! Owns: the report's option validation (`options`), row keys (`keys`), grouping into rows with
//! self/children counts and call trees (`table`), the header (`meta`), and the text, JSON and
//! CSV writers (`text`, `machine`). Input: an in-memory [`Profile`] (loaded by
//! `saved::load`) and a [`ReportConfig`] validated from the CLI's [`ReportOptions`] (the one function
//! from the CLI to the config, as `record`'s [`crate::config::RecordConfig::new`]); output: text on a writer. Nothing here
//! panics on odd profiles: an empty one gives the header and `# no samples`.
//!
//! Semantics (those of `perf report`): rows group the samples that pass the filters (`--pid`,
//! `--tid`, `--comm`, `--thread`, `--state`; all percentages are of those) by the `--sort` keys
//! in the order given. A sample counts its weight (1, or with `record --idle` the sampling
//! instants an off-CPU interval held), so shares are shares of wall-clock time there. Overhead ("Self") counts each sample once, for the keys of its leaf frame;
//! `--children` adds "Children", each sample counted once for every distinct key tuple of any
//! frame in its stack, and sorts by it. Sample keys (comm, pid, tid, thread) mixed with frame
//! keys (module, function, srcline) are evaluated per frame. Rows are sorted by overhead
//! (Children with `--children`), ties by key; `--percent-limit` hides rows under it; `-g
//! caller|callee` prints each row's call tree (see `table`), branches under the percent limit
//! (0.5 % when none is given) pruned.

mod keys;
mod machine;
mod meta;
mod options;
pub mod script;
mod table;
mod text;

#[cfg(test)]
mod script_tests;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;

use std::io::{self, Write};

use crate::profile::Profile;

pub use options::{Config as ReportConfig, OptionError};

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
    /// `--state` filter (thread states: `on-cpu`, `runnable`, `sleeping`, `blocked`,
    /// `gil-wait`).
    pub states: Vec<String>,
    /// `-g caller|callee`.
    pub call_graph: Option<String>,
    /// `--json`.
    pub json: bool,
    /// `--csv`.
    pub csv: bool,
    /// Colour (stdout is a terminal).
    pub color: bool,
    /// The saved file, as shown in the header (empty: not shown).
    pub source: String,
    /// `--full-filenames`: whole Python file names in module and srcline keys.
    pub full_filenames: bool,
    /// `--addresses`: a row per unnamed native address, not one per module.
    pub addresses: bool,
}

/// Writes the report of `profile` as `cfg` (validated from the CLI's [`ReportOptions`] by
/// [`ReportConfig::new`], before the saved file is read) asks.
pub fn render(profile: &Profile, cfg: &ReportConfig, out: &mut dyn Write) -> io::Result<()> {
    let table = table::build(profile, cfg);
    match cfg.style {
        options::Style::Text => text::write(out, profile, cfg, &table),
        options::Style::Json => machine::write_json(out, profile, cfg, &table),
        options::Style::Csv => machine::write_csv(out, cfg, &table),
    }
}
