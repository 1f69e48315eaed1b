//! The machine-readable views of `report`: `--json` and `--csv`, with the same rows (same
//! filters, order and percent limit) as the text view.
//!
//! JSON: one object `{"meta": {…}, "total": N, "rows": [{"keys": {"comm": "…", "pid": 10, …},
//! "samples": N, "overhead": PCT, "children": N, "children_overhead": PCT}], "hidden_rows": N}`
//! where `samples`/`overhead` are self counts (the leaf), `children`/`children_overhead` appear
//! with `--children`, `total` is the samples after the filters (the 100 %), pid and tid are
//! numbers, percentages are unrounded. Call trees (`-g`) are a text-view feature.
//!
//! CSV: a header line `overhead,samples[,children_overhead,children],KEY…` (key names as in
//! `--sort`), then one line per row; percentages with two decimals as in the text view; fields
//! quoted as RFC 4180 says (a field containing `,`, `"`, CR or LF in double quotes, quotes
//! doubled); lines end in LF.

use std::io::{self, Write};

use serde_json::{Map, Value, json};

use super::keys::Part;
use super::meta;
use super::options::Config;
use super::table::Table;
use crate::profile::Profile;

fn part_value(p: &Part) -> Value {
    match p {
        Part::Num(n) => Value::from(*n),
        Part::Text(s) => Value::from(&**s),
    }
}

/// The `meta` object.
fn meta_json(profile: &Profile, cfg: &Config, table: &Table) -> Value {
    let m = &profile.meta;
    let (procs, all_procs) = meta::process_counts(profile, cfg);
    let errors: Map<String, Value> = m
        .errors
        .named()
        .into_iter()
        .take(meta::MAX_ERROR_KINDS)
        .map(|(k, v)| (k, Value::from(v)))
        .collect();
    let f = &cfg.filter;
    json!({
        "source": cfg.source,
        "host": m.host,
        "kernel": m.kernel,
        "start_unix_s": m.start_unix_s,
        "start_utc": meta::utc(m.start_unix_s),
        "duration_s": m.duration_s,
        "rate_hz": m.rate_hz,
        "cpus": m.cpus,
        "command_line": m.command_line,
        "lost_samples": m.lost_samples,
        "errors": errors,
        "samples": table.all_samples,
        "processes": all_procs,
        "processes_after_filters": procs,
        "idle": m.idle,
        "filters": {
            "pid": f.pids,
            "tid": f.tids,
            "comm": f.comms,
            "thread": f.threads,
            "state": f.states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        },
        "sort": cfg.keys.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "children": cfg.children,
        "percent_limit": cfg.percent_limit,
    })
}

/// Writes the JSON view.
pub fn write_json(
    out: &mut dyn Write,
    profile: &Profile,
    cfg: &Config,
    table: &Table,
) -> io::Result<()> {
    let rows: Vec<Value> = table
        .rows
        .iter()
        .map(|r| {
            let keys: Map<String, Value> = cfg
                .keys
                .iter()
                .zip(r.key.iter())
                .map(|(k, p)| (k.name().to_string(), part_value(p)))
                .collect();
            let mut row = json!({
                "keys": keys,
                "samples": r.self_samples,
                "overhead": table.percent(r.self_samples),
            });
            if cfg.children {
                row["children"] = Value::from(r.children);
                row["children_overhead"] = Value::from(table.percent(r.children));
            }
            row
        })
        .collect();
    let doc = json!({
        "meta": meta_json(profile, cfg, table),
        "total": table.total,
        "rows": rows,
        "hidden_rows": table.hidden,
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
}

/// One CSV field, quoted when RFC 4180 requires it.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Writes the CSV view.
pub fn write_csv(out: &mut dyn Write, cfg: &Config, table: &Table) -> io::Result<()> {
    let mut header = vec!["overhead", "samples"];
    if cfg.children {
        header.extend(["children_overhead", "children"]);
    }
    header.extend(cfg.keys.iter().map(|k| k.name()));
    writeln!(out, "{}", header.join(","))?;
    for r in &table.rows {
        let mut fields = vec![
            format!("{:.2}", table.percent(r.self_samples)),
            r.self_samples.to_string(),
        ];
        if cfg.children {
            fields.push(format!("{:.2}", table.percent(r.children)));
            fields.push(r.children.to_string());
        }
        fields.extend(r.key.iter().map(|p| csv_field(&p.to_string())));
        writeln!(out, "{}", fields.join(","))?;
    }
    Ok(())
}
