//! `cargo xtask vm-test [--kernel 5.10|6.1|6.12|host|all]`: the kernel matrix. Each Debian
//! kernel (`kernels.rs`) boots in qemu (`qemu.rs`) on the host's root file system, shared
//! read-only, with an initramfs of our own (`initramfs.rs`), and runs the plan of `guest.rs`;
//! `host` runs the same plan on the running kernel without a VM. Prints one line per kernel:
//! pass/fail, tests, accelerator, the sampling program's variant, its verified instructions
//! and run time per sample, and how long it took; also written to `target/vm-test/summary.txt`.
//!
//! Guests run [`DEFAULT_JOBS`] at a time (`--jobs`), each with 2 CPUs and 4 GiB; the host's
//! kernel runs last, alone. `cargo xtask test` runs the whole matrix.
mod guest;
mod initramfs;
mod kernels;
mod qemu;
pub mod report;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::interpreters::Cache;
use crate::setup::{self, Ready};
use crate::sh::{self, say};

pub use qemu::Accel;
use report::Ran;
pub use report::Row;

/// The longest one guest may run before it is killed (a hung test; TCG runs take ~5 min).
const GUEST_TIMEOUT: Duration = Duration::from_mins(25);
/// Guests at once by default.
pub const DEFAULT_JOBS: usize = 2;
/// Guest memory: the interpreters, `pyebpf` and the test binaries (read over 9p, page cache).
const GUEST_MEMORY_MIB: u32 = 4096;

/// Which kernels: `5.10`, `6.1`, `6.12`, `host`; `all` is every one.
pub fn parse_kernels(args: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for a in args.iter().flat_map(|a| a.split(',')) {
        let names: Vec<String> = if a == "all" {
            kernels::SERIES
                .iter()
                .map(|s| s.name.to_string())
                .chain(["host".to_string()])
                .collect()
        } else if a == "host" || kernels::SERIES.iter().any(|s| s.name == a) {
            vec![a.to_string()]
        } else {
            bail!("unknown kernel '{a}': use 5.10, 6.1, 6.12, host or all");
        };
        for n in names {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    if out.is_empty() {
        return parse_kernels(&["all".to_string()]);
    }
    Ok(out)
}

/// `cargo xtask vm-test`: setup, build, then the matrix.
pub fn run(kernels: &[String], accel: Option<Accel>, jobs: usize) -> Result<()> {
    if !sh::is_root() {
        sh::reexec_as_root("`cargo xtask vm-test`")?;
    }
    let ready = setup::run(&setup::Options {
        interpreters: true,
        no_apt: false,
    })?;
    let bins = build(&ready)?;
    let rows = matrix(&bins, kernels, accel, jobs)?;
    if rows.iter().any(|r| !r.passed) {
        bail!(
            "kernel matrix FAILED (logs under {})",
            out_root()?.display()
        );
    }
    Ok(())
}

/// Where the runs write: `target/vm-test/<kernel>/`.
fn out_root() -> Result<PathBuf> {
    Ok(sh::target_dir()?.join("vm-test"))
}

/// Builds `pyebpf` and the two test binaries the plan runs; their paths.
pub fn build(ready: &Ready) -> Result<guest::Binaries> {
    let target = sh::target_dir()?;
    let mut cmd = sh::cargo();
    cmd.args(["build", "-p", "sampler-user", "--bin", "pyebpf"]);
    ready.apply(&mut cmd);
    sh::run(&mut cmd)?;
    let mut cmd = sh::cargo();
    // The workspace's test binaries, as `cargo xtask test` builds them (the same feature set,
    // so nothing is rebuilt there); the plan runs two of them.
    cmd.args([
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
        "--workspace",
        "--exclude",
        "sampler-ebpf",
    ]);
    ready.apply(&mut cmd);
    println!("+ {}", sh::show(&cmd));
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the test binaries failed (above)");
    }
    let (mut unit, mut e2e) = (None, None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let kinds = msg["target"]["kind"].to_string();
        match msg["target"]["name"].as_str() {
            Some("e2e") => e2e = Some(PathBuf::from(exe)),
            Some(_)
                if kinds.contains("lib")
                    && msg["package_id"].to_string().contains("sampler-user") =>
            {
                unit = Some(PathBuf::from(exe));
            }
            _ => {}
        }
    }
    let cache = Cache::from_env();
    let python312 = python_of(&cache, "3.12")?;
    Ok(guest::Binaries {
        pyebpf: target.join("debug/pyebpf"),
        unit: unit.context("no unit-test binary of sampler-user in cargo's output")?,
        e2e: e2e.context("no e2e test binary in cargo's output")?,
        cache: cache.0,
        python312,
    })
}

/// The interpreter path of `name` from the manifest (must run without a chroot).
fn python_of(cache: &Cache, name: &str) -> Result<String> {
    let text = std::fs::read_to_string(cache.manifest())
        .with_context(|| format!("{} (run setup --interpreters)", cache.manifest().display()))?;
    let list: serde_json::Value = serde_json::from_str(&text)?;
    list.as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name && e["root"].is_null())
        .and_then(|e| e["python"].as_str())
        .map(str::to_owned)
        .with_context(|| format!("interpreter {name} not in {}", cache.manifest().display()))
}

/// Runs the plan on each of `names`: the guests `jobs` at a time, then `host` (alone: its
/// tests sample the whole machine); prints and returns one row per kernel, in `names` order.
pub fn matrix(
    bins: &guest::Binaries,
    names: &[String],
    accel: Option<Accel>,
    jobs: usize,
) -> Result<Vec<Row>> {
    let root = out_root()?;
    std::fs::create_dir_all(&root)?;
    let cache = Cache::from_env();
    let mut accel = accel;
    let mut prepared = Vec::new();
    let mut rows: Vec<Option<Row>> = names.iter().map(|_| None).collect();
    for (i, name) in names.iter().enumerate() {
        if name == "host" {
            continue;
        }
        let out = root.join(name);
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out)?;
        match prepare_guest(bins, &cache, name, &out, &mut accel) {
            Ok(guest) => prepared.push((i, guest)),
            Err(e) => rows[i] = Some(Row::failed(name, &format!("{e:#}"), Duration::ZERO)),
        }
    }
    for chunk in prepared.chunks(jobs.max(1)) {
        let done: Vec<(usize, Row)> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|(i, g)| (*i, scope.spawn(|| g.run())))
                .collect();
            handles
                .into_iter()
                .map(|(i, h)| {
                    let row = h.join().unwrap_or_else(|_| {
                        Row::failed(&names[i], "the guest's thread panicked", Duration::ZERO)
                    });
                    (i, row)
                })
                .collect()
        });
        for (i, row) in done {
            say("vm-test", row.line());
            rows[i] = Some(row);
        }
    }
    if let Some(i) = names.iter().position(|n| n == "host") {
        let started = Instant::now();
        let out = root.join("host");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out)?;
        let row = match run_host(bins, &out) {
            Ok(ran) => Row::of_run("host", &ran, &out, started.elapsed()),
            Err(e) => Row::failed("host", &format!("{e:#}"), started.elapsed()),
        };
        say("vm-test", row.line());
        rows[i] = Some(row);
    }
    let rows: Vec<Row> = rows.into_iter().flatten().collect();
    let mut summary = String::new();
    for r in &rows {
        let _ = writeln!(summary, "{}", r.line());
    }
    std::fs::write(root.join("summary.txt"), &summary)?;
    for r in rows.iter().filter(|r| !r.passed) {
        eprint!("{}", r.failure_tails());
    }
    say("vm-test", "kernel matrix:");
    for r in &rows {
        say("vm-test", format!("  {}", r.line()));
    }
    if names.len() == parse_kernels(&["all".to_string()])?.len() {
        report::update_doc(&rows)?;
    }
    Ok(rows)
}

fn run_host(bins: &guest::Binaries, out: &Path) -> Result<Ran> {
    let script = out.join("guest.sh");
    std::fs::write(&script, guest::script(bins, out, setup::in_ci()))?;
    let status = sh::status(sh::clean("bash").arg(&script))?;
    std::fs::write(
        out.join("guest.rc"),
        format!("{}\n", status.code().unwrap_or(-1)),
    )?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    Ok(Ran {
        kernel: release.trim().to_owned(),
        source: "the host's kernel, no VM".into(),
        accel: "none".into(),
    })
}

/// A guest ready to boot.
struct Prepared {
    series: String,
    kernel: kernels::Kernel,
    initramfs: PathBuf,
    out: PathBuf,
    tmpfs: Vec<PathBuf>,
    accel: Accel,
}

/// Fetches (if needed) the kernel of `series`, builds its initramfs and `guest.sh`, and probes
/// KVM once (the first guest decides for all).
fn prepare_guest(
    bins: &guest::Binaries,
    cache: &Cache,
    series: &str,
    out: &Path,
    accel: &mut Option<Accel>,
) -> Result<Prepared> {
    let spec = kernels::SERIES
        .iter()
        .find(|s| s.name == series)
        .context("unknown series")?;
    let kernel = kernels::ensure(cache, spec)?;
    let initramfs = out.join("initramfs.cpio");
    std::fs::write(&initramfs, initramfs::build(&kernel.modules())?)?;
    let accel = *accel.get_or_insert_with(|| {
        if qemu::kvm_works(&kernel.vmlinuz(), &initramfs, &out.join("kvm-probe")) {
            Accel::Kvm
        } else {
            Accel::Tcg
        }
    });
    std::fs::write(
        out.join("guest.sh"),
        guest::script(bins, out, setup::in_ci()),
    )?;
    Ok(Prepared {
        series: series.to_owned(),
        kernel,
        initramfs,
        out: out.to_path_buf(),
        tmpfs: guest::writable_dirs(&bins.cache),
        accel,
    })
}

impl Prepared {
    /// Boots it, waits for it, reads its results; once more when a failed TCG run's kernel
    /// died of [`tcg_text_poke_oops`] (the row says so, and the first run's files are kept in
    /// `attempt-1/`).
    fn run(&self) -> Row {
        let first = self.run_once();
        if first.passed || self.accel != Accel::Tcg {
            return first;
        }
        let console = std::fs::read_to_string(self.out.join("console.log")).unwrap_or_default();
        let Some(oops) = tcg_text_poke_oops(&console) else {
            return first;
        };
        say(
            "vm-test",
            format!(
                "{}: the guest's kernel died patching its own text under TCG ({oops}): \
                 booting it once more",
                self.series
            ),
        );
        if let Err(e) = self.keep_attempt() {
            return Row::failed(&self.series, &format!("{e:#}"), Duration::ZERO);
        }
        self.run_once().with_note(format!(
            "retried once, the first boot died under TCG: {oops}"
        ))
    }

    /// Moves the first run's results to `attempt-1/` (the boot's inputs stay).
    fn keep_attempt(&self) -> Result<()> {
        let kept = self.out.join("attempt-1");
        std::fs::create_dir_all(&kept)?;
        for entry in std::fs::read_dir(&self.out)? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default();
            if path.is_file() && name != "initramfs.cpio" && name != "guest.sh" {
                std::fs::rename(&path, kept.join(name))?;
            }
        }
        Ok(())
    }

    /// One boot.
    fn run_once(&self) -> Row {
        let started = Instant::now();
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get().min(2)) as u32;
        let vmlinuz = self.kernel.vmlinuz();
        let guest = qemu::Guest {
            vmlinuz: &vmlinuz,
            initramfs: &self.initramfs,
            out: &self.out,
            tmpfs: &self.tmpfs,
            cpus,
            memory_mib: GUEST_MEMORY_MIB,
        };
        say(
            "vm-test",
            format!(
                "{}: booting {} ({} {}) on {}, {cpus} CPUs; console: {}",
                self.series,
                self.kernel.release,
                self.kernel.package,
                self.kernel.version,
                self.accel.name(),
                self.out.join("console.log").display()
            ),
        );
        let finished = guest.run(self.accel, GUEST_TIMEOUT);
        let ran = Ran {
            kernel: self.kernel.release.clone(),
            source: format!("{} {}", self.kernel.package, self.kernel.version),
            accel: self.accel.name().into(),
        };
        match finished {
            Ok(true) => Row::of_run(&self.series, &ran, &self.out, started.elapsed()),
            Ok(false) => Row::failed(
                &self.series,
                &format!("the guest did not finish within {GUEST_TIMEOUT:?}"),
                started.elapsed(),
            ),
            Err(e) => Row::failed(&self.series, &format!("{e:#}"), started.elapsed()),
        }
    }
}

/// The `RIP` line of a kernel oops that multi-threaded TCG causes, not the kernel or our
/// programs: an `int3` trap no handler claimed, in kernel text outside any BPF program. The
/// kernel patches its text (static keys, e.g. a tracepoint's when a program attaches or
/// detaches) with `text_poke_bp`: an `int3` over the first byte, the rest, the first byte back,
/// each step followed by an IPI that serialises every CPU. A CPU that still runs the `int3`
/// after the last step finds no patch in progress and oopses; real CPUs cannot, TCG's CPU
/// threads did once (6.12, at `ttwu_do_activate`'s `sched_wakeup` site, while the off-CPU test
/// attached and detached it, the code bytes already showing the restored NOP under the trap).
/// Single-threaded TCG avoids it but is too slow for the timing of the short-lived process
/// test.
fn tcg_text_poke_oops(console: &str) -> Option<String> {
    let mut lines = console.lines().skip_while(|l| !l.contains("Oops: int3"));
    lines.next()?;
    let rip = lines.find(|l| l.contains("RIP: 0010:"))?;
    let at = rip.split("RIP: 0010:").nth(1)?.trim();
    // A symbol of kernel text: `name+0xoff/0xlen`; not a BPF program or an address alone.
    let symbol = at.split('+').next()?;
    let kernel_text = at.contains('+')
        && !symbol.is_empty()
        && !symbol.starts_with("bpf_")
        && !symbol.starts_with("0x");
    kernel_text.then(|| format!("Oops: int3 at {at}"))
}

/// Fetches every kernel of the matrix into the cache (setup's step); the ones that could not
/// be fetched, with the reason.
pub fn fetch_kernels(cache: &Cache) -> Vec<String> {
    kernels::SERIES
        .iter()
        .filter_map(|s| {
            kernels::ensure(cache, s)
                .err()
                .map(|e| format!("kernel {}: {e:#}", s.name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_lists() {
        let all = parse_kernels(&["all".into()]).unwrap();
        assert_eq!(all, ["5.10", "6.1", "6.12", "host"]);
        assert_eq!(parse_kernels(&[]).unwrap(), all);
        assert_eq!(
            parse_kernels(&["6.1,5.10".into(), "6.1".into()]).unwrap(),
            ["6.1", "5.10"]
        );
        assert!(parse_kernels(&["5.15".into()]).is_err());
    }

    /// The 6.12 guest's console when it died (abridged), and what must not count as such.
    #[test]
    fn text_poke_oops_is_told_from_other_oopses() {
        let died = "\
vm-guest: step offcpu_program_loads_in_every_supported_variant
[   41.143134] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[   41.154876] CPU: 1 UID: 0 PID: 0 Comm: swapper/1 Not tainted 6.12.117+deb12-amd64 #1
[   41.155227] RIP: 0010:ttwu_do_activate+0x8d/0x220
[   41.155506] Code: 89 e2 48 89 de 48 89 ef e8 60 a9 ff ff 44 89 ea 48 89 de <90> 48
[   41.156401] RIP: 0010:pv_native_safe_halt+0xf/0x20
[   41.157271] Kernel panic - not syncing: Fatal exception in interrupt
";
        assert_eq!(
            tcg_text_poke_oops(died).as_deref(),
            Some("Oops: int3 at ttwu_do_activate+0x8d/0x220")
        );
        let in_bpf = died.replace(
            "ttwu_do_activate+0x8d/0x220",
            "bpf_prog_6deef7357e7b4530_pyebpf_sample+0x1c/0x2d0",
        );
        assert_eq!(
            tcg_text_poke_oops(&in_bpf),
            None,
            "an int3 in a BPF program"
        );
        let unnamed = died.replace("ttwu_do_activate+0x8d/0x220", "0xffffffffc0a01234");
        assert_eq!(
            tcg_text_poke_oops(&unnamed),
            None,
            "an address without a symbol"
        );
        let gp = died.replace("Oops: int3", "Oops: general protection fault");
        assert_eq!(tcg_text_poke_oops(&gp), None, "another oops");
        assert_eq!(tcg_text_poke_oops("vm-guest: all steps done"), None);
    }
}
