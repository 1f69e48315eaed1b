//! `cargo xtask soak [--mins N] [--count K] [--release]`: a long `record --all -r 1000` on a
//! churning host (as root).
//!
//! While it records: `driver.py` starts K short-lived Python processes (3.12, 3.13, 3.13t in
//! turn; each spins 10–200 ms of CPU time six frames deep in `burn`) evenly over the run, a 3.13t process
//! starts and joins threads without end (`threads.py`), and a shell execs `/bin/true` about a
//! thousand times a second. Reported: crashes of `record` (a signal, a panic or a failing
//! exit: must be 0), lost samples, errors by kind, `record`'s RSS every 10 s, and the share of
//! the short-lived processes that spun ≥ 100 ms of CPU whose samples carry their Python frames
//! (`burn`; must be ≥ 95 %). `cargo xtask test` runs it for one minute; the 10-minute figures
//! are in docs/benchmarks.md.
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::interpreters::Cache;
use crate::sh::{self, say};

pub struct Options {
    pub mins: f64,
    /// Short-lived processes started over the run.
    pub count: usize,
    /// The release build instead of the debug one.
    pub release: bool,
}

/// Least share of the ≥ 100 ms processes with their Python frames in the profile.
const MIN_SHARE: f64 = 0.95;
/// Seconds between `record`'s start and the workloads' (attach of the host's processes).
const WARM_UP: u64 = 5;

/// What a soak found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub crashed: Option<String>,
    pub samples_line: String,
    pub lost: u64,
    pub errors: String,
    /// (seconds since start, RSS in KiB).
    pub rss: Vec<(u64, u64)>,
    pub started: usize,
    pub long_ones: usize,
    pub long_with_frames: usize,
    /// The ≥ 100 ms processes without their frames: `pid interpreter ms: what their samples show`.
    pub missed: Vec<String>,
}

/// Kills and reaps a helper process when dropped (also on an early error).
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python(cache: &Cache, name: &str) -> Result<PathBuf> {
    let text = std::fs::read_to_string(cache.manifest()).with_context(|| {
        format!(
            "{} (run `cargo xtask setup --interpreters`)",
            cache.manifest().display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    v.as_array()
        .and_then(|l| l.iter().find(|e| e["name"] == name))
        .filter(|e| e["root"].is_null())
        .and_then(|e| e["python"].as_str())
        .map(PathBuf::from)
        .with_context(|| format!("interpreter {name} not in {}", cache.manifest().display()))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn run(opts: &Options) -> Result<Outcome> {
    if !sh::is_root() {
        sh::reexec_as_root("`cargo xtask soak`")?;
    }
    let cache = Cache::from_env();
    let pythons = ["3.12", "3.13", "3.13t"]
        .map(|n| python(&cache, n))
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let profile = if opts.release { "release" } else { "debug" };
    let mut build = sh::cargo();
    build.args(["build", "-p", "sampler-user", "--bin", "pyebpf"]);
    if opts.release {
        build.arg("--release");
    }
    sh::run(&mut build)?;
    let bin = sh::target_dir()?.join(profile).join("pyebpf");
    let dir = sh::target_dir()?.join("soak");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let secs = (opts.mins * 60.0).round().max(10.0) as u64;
    let folded = dir.join("soak.txt");
    let stderr = dir.join("record.stderr");
    say(
        "soak",
        format!(
            "{} record --all -r 1000 for {secs} s with {} short-lived processes, thread churn and an exec storm",
            bin.display(),
            opts.count
        ),
    );
    let mut record = Command::new(&bin);
    record
        .args(["record", "--all", "-r", "1000", "-q", "-d"])
        .arg((secs + WARM_UP + 3).to_string())
        .arg("-o")
        .arg(&folded)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr)?);
    let mut record = Helper(record.spawn().context("starting pyebpf record")?);
    let pid = record.0.id();
    let t0 = Instant::now();
    let mut rss = Vec::new();
    std::thread::sleep(Duration::from_secs(WARM_UP));
    let ledger = dir.join("processes.txt");
    let mut helpers = workloads(&pythons, secs, opts.count, &ledger)?;
    let mut next_rss = 0;
    let status = loop {
        let elapsed = t0.elapsed().as_secs();
        if elapsed >= next_rss {
            if let Some(kib) = rss_kib(pid) {
                say(
                    "soak",
                    format!("{elapsed:>4} s: record RSS {} MiB", kib / 1024),
                );
                rss.push((elapsed, kib));
            }
            next_rss += 10;
        }
        if elapsed >= WARM_UP + secs {
            // The churn is over: stop the rest, let the driver finish its ledger.
            helpers.truncate(1);
        }
        if let Some(st) = record.0.try_wait()? {
            break st;
        }
        if elapsed > WARM_UP + secs + 120 {
            bail!("record did not stop 120 s after its -d");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if let Some(mut d) = helpers.pop() {
        d.0.wait()?;
    }
    let mut o = Outcome {
        rss,
        ..Outcome::default()
    };
    read_summary(&stderr, status, &mut o)?;
    share(&ledger, &folded, &mut o)?;
    report(&o, secs);
    if let Some(c) = &o.crashed {
        bail!("record crashed: {c} (stderr in {})", stderr.display());
    }
    let share = o.long_with_frames as f64 / o.long_ones.max(1) as f64;
    if o.long_ones == 0 || share < MIN_SHARE {
        bail!(
            "{} of {} processes that spun >= 100 ms have Python frames ({:.1} %, want >= {:.0} %)",
            o.long_with_frames,
            o.long_ones,
            100.0 * share,
            100.0 * MIN_SHARE
        );
    }
    Ok(o)
}

/// The churn: the driver of short-lived processes (first: it is waited for at the end), the
/// thread churn and the exec storm.
fn workloads(pythons: &[PathBuf], secs: u64, count: usize, ledger: &Path) -> Result<Vec<Helper>> {
    let workloads = sh::workspace_root().join("tests/workloads/soak");
    let driver = Helper(
        sh::clean(&pythons[0])
            .arg(workloads.join("driver.py"))
            .args([
                "--seconds",
                &secs.to_string(),
                "--count",
                &count.to_string(),
                "--out",
            ])
            .arg(ledger)
            .args(pythons)
            .stdin(Stdio::null())
            .spawn()
            .context("starting the process churn")?,
    );
    let threads = Helper(
        sh::clean(&pythons[2])
            .arg(workloads.join("threads.py"))
            .stdin(Stdio::null())
            .spawn()
            .context("starting the thread churn")?,
    );
    let storm = Helper(
        Command::new("sh")
            .args([
                "-c",
                "while :; do for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done; sleep 0.01; done",
            ])
            .stdin(Stdio::null())
            .spawn()
            .context("starting the exec storm")?,
    );
    Ok(vec![driver, threads, storm])
}

/// Crashes, lost samples, errors and the samples line from `record`'s stderr.
fn read_summary(stderr: &Path, status: std::process::ExitStatus, o: &mut Outcome) -> Result<()> {
    let mut err = String::new();
    std::fs::File::open(stderr)?.read_to_string(&mut err)?;
    if !status.success() || err.contains("panicked") {
        o.crashed = Some(format!(
            "{status}: {}",
            err.lines().last().unwrap_or_default()
        ));
    }
    for l in err.lines() {
        if let Some(n) = l.strip_prefix("pyebpf: lost samples: ") {
            o.lost = n.trim().parse().unwrap_or(0);
        } else if let Some(e) = l.strip_prefix("pyebpf: errors: ") {
            e.clone_into(&mut o.errors);
        } else if l.contains(" samples from ") {
            l.trim_start_matches("pyebpf: ")
                .clone_into(&mut o.samples_line);
        }
    }
    Ok(())
}

/// Which ledger processes (spun ≥ 100 ms) have a sample with `burn` in their stack.
fn share(ledger: &Path, folded: &Path, o: &mut Outcome) -> Result<()> {
    let ledger = std::fs::read_to_string(ledger).context("the churn's ledger")?;
    let mut long = Vec::new();
    for l in ledger.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if let [pid, python, ms] = w[..] {
            o.started += 1;
            if ms.parse::<f64>().unwrap_or(0.0) >= 100.0 {
                long.push((pid.to_owned(), format!("{pid} {python} {ms} ms")));
            }
        }
    }
    let text = std::fs::read_to_string(folded).context("the folded profile")?;
    let mut with_frames = std::collections::HashSet::new();
    // Per pid: samples, samples with a Python frame, samples with an unresolved one.
    let mut seen: std::collections::HashMap<String, [u64; 3]> = std::collections::HashMap::new();
    for l in text.lines() {
        let Some(root) = l.split(';').next() else {
            continue;
        };
        let Some(pid) = root
            .rsplit_once(" (")
            .and_then(|(_, p)| p.strip_suffix(')'))
        else {
            continue;
        };
        if l.contains(";burn (") {
            with_frames.insert(pid.to_owned());
        }
        let n: u64 = l
            .rsplit_once(' ')
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or(0);
        let c = seen.entry(pid.to_owned()).or_default();
        c[0] += n;
        if l.contains(" (<string>:") || l.contains("[unknown python frame]") {
            c[1] += n;
        }
        if l.contains("[unknown python frame]") {
            c[2] += n;
        }
    }
    o.long_ones = long.len();
    o.long_with_frames = long.iter().filter(|(p, _)| with_frames.contains(p)).count();
    o.missed = long
        .iter()
        .filter(|(p, _)| !with_frames.contains(p))
        .map(|(p, what)| {
            let [n, py, unknown] = seen.get(p).copied().unwrap_or_default();
            format!("{what}: {n} samples, {py} with Python frames, {unknown} with unresolved ones")
        })
        .collect();
    Ok(())
}

fn report(o: &Outcome, secs: u64) {
    say("soak", "results:");
    println!("| | |\n|---|---|");
    println!("| run | {secs} s of churn, `record --all -r 1000` |");
    println!("| record | {} |", o.samples_line);
    println!(
        "| crashes | {} |",
        o.crashed
            .as_deref()
            .map_or("0".to_owned(), |c| format!("1 ({c})"))
    );
    println!("| lost samples | {} |", o.lost);
    println!("| errors by kind | {} |", o.errors);
    println!(
        "| short-lived processes | {} finished; {} spun >= 100 ms, {} of them ({:.1} %) with Python frames |",
        o.started,
        o.long_ones,
        o.long_with_frames,
        100.0 * o.long_with_frames as f64 / o.long_ones.max(1) as f64
    );
    for m in &o.missed {
        println!("| without its frames | {m} |");
    }
    let series: Vec<String> = o
        .rss
        .iter()
        .map(|(t, k)| format!("{t} s {:.1}", *k as f64 / 1024.0))
        .collect();
    println!("| RSS every 10 s (MiB) | {} |", series.join(", "));
}
