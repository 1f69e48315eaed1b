//! The one prerequisite policy of every pyebpf test (unit tests of `sampler-user`, the
//! end-to-end tests): a test that needs root, eBPF, an interpreter or a tool calls [`missing`]
//! when it is absent.
//!
//! - Under `CI=true` (what `.ci/run` sets; nothing else counts as CI) a missing prerequisite
//!   fails the test: CI provides every prerequisite.
//! - Elsewhere the test is skipped: one `SKIPPED <test>: <what>` line goes to the real standard
//!   error (written to fd 2 directly: libtest captures `eprintln!` of passing tests, and a skip
//!   must show), and one line to the file named by `PYEBPF_SKIP_LOG` (set by `cargo xtask
//!   test`, which counts the skipped tests in its summary line).

use std::io::Write as _;

/// The variable naming the skip log.
pub const SKIP_LOG_ENV: &str = "PYEBPF_SKIP_LOG";

/// Whether this is a CI run: `CI=true`, exactly as `.ci/run` sets it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The running test's name (libtest names each test's thread after it).
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("(unnamed test)")
        .to_owned()
}

/// `what` (a prerequisite) is missing: under `CI=true` this panics (the test fails); otherwise
/// the skip is written to stderr and the skip log, and `true` is returned, so callers write
/// `if !found && missing("…") { return; }` or `let Some(x) = … else { missing(…); return; }`.
pub fn missing(what: &str) -> bool {
    record(
        what,
        in_ci(),
        std::env::var_os(SKIP_LOG_ENV).map(std::path::PathBuf::from),
    )
}

fn record(what: &str, ci: bool, log: Option<std::path::PathBuf>) -> bool {
    let test = test_name();
    assert!(!ci, "{test}: prerequisite missing under CI=true: {what}");
    let line = format!("SKIPPED {test}: {what}").replace('\n', " ");
    let _ = writeln!(std::io::stderr(), "\n*** {line} ***\n");
    if let Some(path) = log
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
    true
}

/// Whether the test runs as root (effective uid 0, from `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            .is_some_and(|euid| euid == "0")
    })
}

/// Root, or [`missing`] (`false`: skip): `if !require_root("…") { return; }`.
pub fn require_root(why: &str) -> bool {
    is_root() || !missing(&format!("needs root ({why})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_logged_with_its_test_name_and_fails_under_ci() {
        let log = std::env::temp_dir().join(format!("prereq-skips-{}", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let l = log.clone();
        let skipped = std::thread::Builder::new()
            .name("my::test".into())
            .spawn(move || record("a tool\nwith a newline", false, Some(l)))
            .unwrap()
            .join()
            .unwrap();
        assert!(skipped);
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "SKIPPED my::test: a tool with a newline\n"
        );
        let _ = std::fs::remove_file(&log);
        let under_ci = std::thread::spawn(|| record("x", true, None)).join();
        assert!(under_ci.is_err(), "a skip under CI=true must fail the test");
    }
}
