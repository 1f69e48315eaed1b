//! The run metadata a report shows: the `#` header lines of the text view and the `meta`
//! object of `--json`, from [`RunMeta`](crate::profile::RunMeta), the sample counts and the
//! filters. Long values (command line, host, error list) are bounded.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::options::Config;
use super::table::Table;
use crate::profile::Profile;

/// Longest header value, in characters (a longer one ends in `…`).
pub const MAX_VALUE: usize = 2000;
/// Most error kinds listed.
pub const MAX_ERROR_KINDS: usize = 32;

/// The header as (name, value) lines, in print order.
pub struct Summary {
    /// `name: value` lines.
    pub lines: Vec<(&'static str, String)>,
}

/// `s` cut to [`MAX_VALUE`] characters.
fn bounded(s: &str) -> String {
    if s.chars().count() <= MAX_VALUE {
        return s.to_string();
    }
    let mut t: String = s.chars().take(MAX_VALUE).collect();
    t.push('…');
    t
}

/// Processes among the samples that pass the filters, and among all samples.
pub fn process_counts(profile: &Profile, cfg: &Config) -> (usize, usize) {
    let mut all = BTreeSet::new();
    let mut kept = BTreeSet::new();
    for (k, _) in profile.counts() {
        all.insert(k.pid);
        if cfg.filter.accepts(profile, k) {
            kept.insert(k.pid);
        }
    }
    (kept.len(), all.len())
}

/// A command line as a shell would read it back: arguments with spaces or quotes in single
/// quotes.
pub fn command_line(args: &[String]) -> String {
    let mut s = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        if !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
        {
            s.push_str(a);
        } else {
            s.push('\'');
            s.push_str(&a.replace('\'', r"'\''"));
            s.push('\'');
        }
        if s.len() > MAX_VALUE * 4 {
            break;
        }
    }
    bounded(&s)
}

/// The filters as CLI flags, for the header.
pub fn filters(cfg: &Config) -> String {
    let f = &cfg.filter;
    let mut s = String::new();
    let mut add = |flag: &str, values: Vec<String>| {
        if !values.is_empty() {
            if !s.is_empty() {
                s.push(' ');
            }
            let _ = write!(s, "{flag} {}", values.join(","));
        }
    };
    add("--pid", f.pids.iter().map(ToString::to_string).collect());
    add("--tid", f.tids.iter().map(ToString::to_string).collect());
    add("--comm", f.comms.clone());
    add("--thread", f.threads.clone());
    add(
        "--state",
        f.states.iter().map(|s| s.as_str().to_string()).collect(),
    );
    bounded(&s)
}

/// `start_unix_s` as `YYYY-MM-DD HH:MM:SS UTC` (`unknown` for 0).
pub fn utc(unix_s: u64) -> String {
    if unix_s == 0 {
        return "unknown".into();
    }
    let days = unix_s / 86_400;
    let rem = unix_s % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01 so that leap days end each 400-year era's years.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097; // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March-based year
    let mp = (5 * doy + 2) / 153; // March = 0
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// The error counts as `kind N, kind N`.
pub fn errors(profile: &Profile) -> String {
    let errors = profile.meta.errors.named();
    let mut s = String::new();
    for (i, (kind, n)) in errors.iter().enumerate() {
        if i == MAX_ERROR_KINDS {
            let _ = write!(s, ", … {} more kinds", errors.len() - i);
            break;
        }
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{kind} {n}");
    }
    bounded(&s)
}

/// The header lines.
pub fn summary(profile: &Profile, cfg: &Config, table: &Table) -> Summary {
    let m = &profile.meta;
    let filtered = cfg.filter.is_active();
    let (procs, all_procs) = process_counts(profile, cfg);
    let mut lines: Vec<(&'static str, String)> = Vec::new();
    if !cfg.source.is_empty() {
        lines.push(("source", bounded(&cfg.source)));
    }
    lines.push((
        "samples",
        if filtered {
            format!("{} of {} after filters", table.total, table.all_samples)
        } else {
            table.total.to_string()
        },
    ));
    if filtered {
        lines.push(("filters", filters(cfg)));
    }
    lines.push(("lost samples", m.lost_samples.to_string()));
    lines.push(("duration", format!("{:.2} s", m.duration_s)));
    lines.push((
        "rate",
        if m.idle {
            format!(
                "{} Hz per CPU; wall clock (--idle): Python threads off a CPU too",
                m.rate_hz
            )
        } else {
            format!("{} Hz per CPU", m.rate_hz)
        },
    ));
    lines.push(("CPUs", m.cpus.to_string()));
    lines.push((
        "processes",
        if filtered {
            format!("{procs} of {all_procs}")
        } else {
            procs.to_string()
        },
    ));
    lines.push(("host", bounded(&m.host)));
    lines.push(("kernel", bounded(&m.kernel)));
    lines.push(("start", utc(m.start_unix_s)));
    lines.push(("command line", command_line(&m.command_line)));
    if !m.errors.is_empty() {
        lines.push(("errors", errors(profile)));
    }
    Summary { lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "unknown");
        assert_eq!(utc(1), "1970-01-01 00:00:01 UTC");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.
        assert_eq!(utc(951_827_696), "2000-02-29 12:34:56 UTC");
        assert_eq!(utc(1_709_251_199), "2024-02-29 23:59:59 UTC");
        assert_eq!(utc(4_102_444_800), "2100-01-01 00:00:00 UTC");
        // Far future: no overflow, no panic.
        assert!(utc(u64::MAX / 2).ends_with(" UTC"));
    }

    #[test]
    fn command_lines_read_back() {
        let args: Vec<String> = ["pyebpf", "record", "-o", "a b.svg", "--", "python3", "it's"]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            command_line(&args),
            r"pyebpf record -o 'a b.svg' -- python3 'it'\''s'"
        );
        assert_eq!(command_line(&[String::new()]), "''");
        let long = vec!["x".repeat(10_000)];
        assert!(command_line(&long).chars().count() <= MAX_VALUE + 1);
    }
}
