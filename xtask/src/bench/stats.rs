//! Medians with min–max over runs, and table cells that are either such a figure or
//! "n/a: reason".
use std::fmt::Write as _;

/// Median and range of one figure over its successful runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

/// One figure: the per-run values (or why a run produced none).
pub type Runs = Vec<Result<f64, String>>;

/// A table cell: `median (min–max)` with `decimals` digits and a unit, a count of failed runs,
/// or "n/a: reason" when no run produced the figure.
pub fn cell(runs: &Runs, decimals: usize, unit: &str) -> String {
    format_cell(runs, decimals, unit, false)
}

/// Like [`cell`] for changes that can go either way: explicit signs, "min to max".
pub fn signed_cell(runs: &Runs, decimals: usize, unit: &str) -> String {
    format_cell(runs, decimals, unit, true)
}

/// One value when every run agrees (a property, not a measurement), else min–max.
pub fn same_cell(runs: &Runs) -> String {
    let ok: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    match summarize(&ok) {
        None => cell(runs, 0, ""),
        Some(s) if s.min.total_cmp(&s.max).is_eq() => format!("{:.0}", s.min),
        Some(s) => format!("{:.0}–{:.0}", s.min, s.max),
    }
}

fn format_cell(runs: &Runs, decimals: usize, unit: &str, signed: bool) -> String {
    let ok: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    let failed: Vec<&String> = runs.iter().filter_map(|r| r.as_ref().err()).collect();
    match summarize(&ok) {
        None => format!(
            "n/a: {}",
            failed
                .first()
                .map_or("no runs", |s| s.as_str())
                .replace('|', "/")
        ),
        Some(s) => {
            let d = decimals;
            let mut out = if s.n == 1 {
                format!("{:.d$}{unit} (1 run)", s.median)
            } else if signed {
                format!("{:+.d$}{unit} ({:+.d$} to {:+.d$})", s.median, s.min, s.max)
            } else {
                format!("{:.d$}{unit} ({:.d$}–{:.d$})", s.median, s.min, s.max)
            };
            if !failed.is_empty() {
                let _ = write!(out, " [{} of {} runs failed]", failed.len(), runs.len());
            }
            out
        }
    }
}

/// The first failure message of a figure, for the notes under a table.
pub fn first_error(runs: &Runs) -> Option<&str> {
    runs.iter()
        .find_map(|r| r.as_ref().err().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::float_cmp, reason = "medians of small integers are exact")]
    fn median_and_range() {
        let s = summarize(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 10.0, 4));
        assert_eq!(summarize(&[5.0, 1.0, 3.0]).unwrap().median, 3.0);
        assert!(summarize(&[f64::NAN]).is_none());
    }

    #[test]
    fn cells() {
        let runs: Runs = vec![Ok(1.0), Ok(3.0), Ok(2.0), Err("boom".into())];
        assert_eq!(cell(&runs, 1, " s"), "2.0 s (1.0–3.0) [1 of 4 runs failed]");
        let change: Runs = vec![Ok(-4.0), Ok(2.0), Ok(1.0)];
        assert_eq!(signed_cell(&change, 1, " %"), "+1.0 % (-4.0 to +2.0)");
        assert_eq!(same_cell(&vec![Ok(349.0), Ok(349.0)]), "349");
        let none: Runs = vec![Err("no Python frames | yet".into())];
        assert_eq!(cell(&none, 1, ""), "n/a: no Python frames / yet");
    }
}
