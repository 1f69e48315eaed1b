//! The text view of `report`, like `perf report --stdio`: `#` header lines with the run's
//! metadata, a column header, one line per row, and with `-g` the row's call tree under it.
//!
//! Columns: Overhead (self %), Samples, one per key; with `--children`: Children %, Self %,
//! Samples (the row's Children samples, the count behind the first column), one per key.
//!
//! Everything taken from the profile (names, host, command line) is printed with control
//! characters replaced by `?`, so a crafted name cannot drive the terminal. Columns are padded
//! to their widest value, at most [`MAX_COLUMN`] characters (longer values overflow); the last
//! column is not padded. Call trees print one frame per line with its share of the row; a
//! frame that is its parent's only shown callee with all of its samples stays at its parent's
//! indentation (a straight chain reads as a column), a branch indents by two.

use std::io::{self, Write};

use super::meta::{self, Summary};
use super::options::Config;
use super::table::{self, Table, Tree};
use crate::profile::Profile;

/// Widest padding of a column.
pub const MAX_COLUMN: usize = 60;
/// Most lines of one call tree.
pub const MAX_TREE_LINES: usize = 5000;
/// Deepest indentation level of a call tree (deeper levels print at this one).
const MAX_INDENT_LEVEL: usize = 40;

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const RESET: &str = "\x1b[0m";

/// `s` made printable ([`crate::printable`]).
pub fn clean(s: &str) -> String {
    crate::printable::printable(s).into_owned()
}

/// Writes the header lines.
fn write_header(out: &mut dyn Write, summary: &Summary) -> io::Result<()> {
    for (name, value) in &summary.lines {
        writeln!(out, "# {name}: {}", clean(value))?;
    }
    writeln!(out, "#")
}

/// One text column.
struct Column {
    header: String,
    right: bool,
    cells: Vec<String>,
    width: usize,
}

impl Column {
    fn new(header: &str, right: bool, cells: Vec<String>) -> Column {
        let width = cells
            .iter()
            .map(|c| c.chars().count())
            .chain([header.chars().count()])
            .max()
            .unwrap_or(0)
            .min(MAX_COLUMN);
        Column {
            header: header.to_string(),
            right,
            cells,
            width,
        }
    }
}

fn pad(s: &str, width: usize, right: bool, last: bool) -> String {
    let n = s.chars().count();
    if n >= width || (last && !right) {
        return s.to_string();
    }
    let fill = " ".repeat(width - n);
    if right {
        fill + s
    } else {
        s.to_string() + &fill
    }
}

/// Wraps the number in an overhead cell in colour (perf's: red ≥ 5 %, green ≥ 0.5 %).
fn colored(cell: &str, pct: f64) -> String {
    let color = if pct >= 5.0 {
        RED
    } else if pct >= 0.5 {
        GREEN
    } else {
        return cell.to_string();
    };
    let body = cell.trim_start();
    let lead = &cell[..cell.len() - body.len()];
    format!("{lead}{color}{body}{RESET}")
}

/// The columns of the rows: percentages, samples, one per key.
fn columns(cfg: &Config, table: &Table) -> Vec<Column> {
    let pct = |n: u64| format!("{:.2}%", table.percent(n));
    let mut columns = Vec::new();
    if cfg.children {
        columns.push(Column::new(
            "# Children",
            true,
            table.rows.iter().map(|r| pct(r.children)).collect(),
        ));
    }
    columns.push(Column::new(
        if cfg.children { "Self" } else { "# Overhead" },
        true,
        table.rows.iter().map(|r| pct(r.self_samples)).collect(),
    ));
    columns.push(Column::new(
        "Samples",
        true,
        table.rows.iter().map(|r| r.children.to_string()).collect(),
    ));
    for (i, key) in cfg.keys.iter().enumerate() {
        columns.push(Column::new(
            key.header(),
            key.is_numeric(),
            table
                .rows
                .iter()
                .map(|r| {
                    r.key
                        .get(i)
                        .map(|p| clean(&p.to_string()))
                        .unwrap_or_default()
                })
                .collect(),
        ));
    }
    columns
}

/// Writes the text report.
pub fn write(
    out: &mut dyn Write,
    profile: &Profile,
    cfg: &Config,
    table: &Table,
) -> io::Result<()> {
    write_header(out, &meta::summary(profile, cfg, table))?;
    if table.total == 0 {
        if cfg.filter.is_active() && table.all_samples > 0 {
            writeln!(out, "# no samples after filters")?;
        } else {
            writeln!(out, "# no samples")?;
        }
        return Ok(());
    }
    let columns = columns(cfg, table);
    let last = columns.len() - 1;
    let line = |cells: Vec<String>| cells.join("  ").trim_end().to_string();
    writeln!(
        out,
        "{}",
        line(
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| pad(&c.header, c.width, c.right, i == last))
                .collect()
        )
    )?;
    writeln!(
        out,
        "{}",
        line(
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let dots = if i == 0 {
                        format!("# {}", ".".repeat(c.width.saturating_sub(2)))
                    } else {
                        ".".repeat(c.width)
                    };
                    pad(&dots, c.width, false, i == last)
                })
                .collect()
        )
    )?;
    writeln!(out, "#")?;
    for (r, row) in table.rows.iter().enumerate() {
        let cells: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let cell = pad(&c.cells[r], c.width, c.right, i == last);
                if cfg.color && i == 0 {
                    colored(&cell, table.percent(row.children))
                } else {
                    cell
                }
            })
            .collect();
        writeln!(out, "{}", line(cells))?;
        if let Some(tree) = &row.graph {
            write_tree(out, profile, tree, cfg.graph_limit)?;
            writeln!(out)?;
        }
    }
    if table.hidden > 0 {
        writeln!(out, "#")?;
        writeln!(
            out,
            "# {} rows under {}% not shown (--percent-limit)",
            table.hidden, cfg.percent_limit
        )?;
    }
    Ok(())
}

/// Writes a row's call tree: one frame per line with its share of the row, branches under
/// `limit` percent pruned.
pub fn write_tree(
    out: &mut dyn Write,
    profile: &Profile,
    tree: &Tree,
    limit: f64,
) -> io::Result<()> {
    let row = tree.root().count;
    let shown = |i: usize| -> Vec<usize> {
        tree.node(i)
            .children
            .iter()
            .copied()
            .filter(|&c| table::percent(tree.node(c).count, row) >= limit)
            .collect()
    };
    // (node, indentation level), depth first.
    let mut todo: Vec<(usize, usize)> = shown(0).into_iter().rev().map(|c| (c, 0)).collect();
    let mut lines = 0;
    while let Some((i, level)) = todo.pop() {
        let node = tree.node(i);
        if lines == MAX_TREE_LINES {
            writeln!(
                out,
                "{}… (call graph cut at {MAX_TREE_LINES} lines)",
                indent(level)
            )?;
            break;
        }
        writeln!(
            out,
            "{}{:>6.2}%  {}",
            indent(level),
            table::percent(node.count, row),
            clean(&table::label(profile, node.frame))
        )?;
        lines += 1;
        let next = shown(i);
        let straight = next.len() == 1 && tree.node(next[0]).count == node.count;
        let child_level = if straight { level } else { level + 1 };
        todo.extend(next.into_iter().rev().map(|c| (c, child_level)));
    }
    Ok(())
}

fn indent(level: usize) -> String {
    " ".repeat(12 + 2 * level.min(MAX_INDENT_LEVEL))
}
