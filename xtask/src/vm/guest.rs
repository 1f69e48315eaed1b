//! What runs on each kernel of the matrix, and what its output says.
//!
//! The plan is data ([`plan`]): root unit tests of the collector ([`UNIT_TESTS`]: every program
//! variant loaded in every record variant, the kernel probes, what differs between kernels),
//! then a small end-to-end set — `record -p` exact stacks on 3.12 and 3.13t, `record --all` with three
//! interpreters at once, the `--native` merge, `--gil`, `--kernel`, `dump` — then one
//! `PYEBPF_STATS=1` recording whose summary gives the program's variant, verified instructions
//! and run time per sample. It becomes `guest.sh` in the run's output directory; the guest's
//! init (or the host, for the host's own kernel) runs it as root. Each step writes
//! `<step>.log` and a line `step<TAB>exit<TAB>seconds` to `steps.tsv`.
//!
//! The tests are the suite's own, unchanged: their durations count samples in guest time,
//! which emulation does not stretch (the CPU-clock event fires on the guest's clock), and
//! their waits for workloads are minutes long. What emulation slows is start-up work, which no
//! test times.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The test binaries and settings a plan runs with.
pub struct Binaries {
    /// `pyebpf` (debug build).
    pub pyebpf: PathBuf,
    /// The `sampler-user` library's unit-test binary.
    pub unit: PathBuf,
    /// The `integration-tests` e2e binary.
    pub e2e: PathBuf,
    /// The test cache and manifest.
    pub cache: PathBuf,
    /// 3.12's interpreter, for the stats step.
    pub python312: String,
}

/// Steps in [`plan`]: the kernel, each test, the stats recording.
pub const STEPS: usize = 2 + UNIT_TESTS.len() + E2E_TESTS.len();

/// One step of the plan.
pub struct Step {
    pub name: &'static str,
    /// A bash command line (quoted where needed; run with `eval`).
    pub command: String,
}

/// Unit tests that need root and a real kernel, by exact name: every program variant loads in
/// every record variant (`variant-load:` lines), the probes agree with the kernel, kernel-mode
/// samples get the task's saved user registers (the code that differs most between variants),
/// a foreign pid namespace (`bpf_get_ns_current_pid_tgid`), truncation at the full 256-frame
/// budget, the per-frame checks that stop a walk at an invalid frame and the flag for an
/// unreadable code object (both program variants where the kernel has `bpf_loop`). (The other collector tests check logic that does not depend on the kernel; the
/// e2e set below covers exact stacks.)
pub const UNIT_TESTS: &[&str] = &[
    "collect::root_tests::loads_every_variant_at_every_stack_size_class",
    "collect::root_tests::kernel_features_match_the_kernel_version",
    "collect::root_tests::kernel_mode_samples_use_task_regs_and_kernel_stacks",
    "collect::python_tests::kernel_capture_translates_tids_of_a_foreign_pid_namespace",
    "collect::python_tests::kernel_capture_truncates_beyond_the_frame_budget",
    "collect::python_tests::kernel_stops_at_the_first_invalid_frame",
    "collect::python_tests::kernel_flags_an_unreadable_code_object",
    "collect::offcpu_tests::offcpu_program_loads_in_every_supported_variant",
];

/// End-to-end tests, by exact name: `record -p` exact stacks on 3.12 and 3.13t, `record --all`
/// with 3.12, 3.13t and 3.14 at once, the `--native` merge, `--gil`, `--kernel`, `dump`,
/// `--idle` off-CPU stacks in each variant (timing-free).
pub const E2E_TESTS: &[&str] = &[
    "pyrecord::stacks::deep_stack_3_12",
    "pyrecord::stacks::deep_stack_3_13t",
    "pyrecord::all::all_three_interpreters_late_starter_and_short_lived_process",
    "pyrecord::native::native_merge_python_c_python_3_12",
    "pyrecord::gil::gil_keeps_only_the_thread_holding_the_gil_3_12",
    "record::kernel_frames_above_user_frames",
    "dump::two_threads_3_12",
    "pyrecord::idle::idle_off_cpu_stacks_each_variant_3_12",
];

/// Directories the tests write below the read-only root, besides /tmp: the sid root's /tmp
/// (3.14 and 3.15 run chrooted there).
pub fn writable_dirs(cache: &Path) -> Vec<PathBuf> {
    vec![cache.join("roots/sid/tmp")]
}

/// The plan for `bins`: one step per test (so `steps.tsv` times each one), [`STEPS`] in all.
pub fn plan(bins: &Binaries) -> Vec<Step> {
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let test = |bin: &Path, name: &'static str| Step {
        name: name.rsplit("::").next().unwrap_or(name),
        command: format!("{} --test-threads=1 --nocapture --exact {name}", q(bin)),
    };
    let mut steps = vec![Step {
        name: "kernel",
        command: "uname -r && ls -l /sys/kernel/btf/vmlinux".into(),
    }];
    steps.extend(UNIT_TESTS.iter().map(|t| test(&bins.unit, t)));
    steps.extend(E2E_TESTS.iter().map(|t| test(&bins.e2e, t)));
    steps.push(Step {
        name: "stats",
        command: format!("stats {}", shell_quote(&bins.python312)),
    });
    steps
}

/// `guest.sh`: the plan as a bash script writing into `out`.
pub fn script(bins: &Binaries, out: &Path, ci: bool) -> String {
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#!/bin/bash\n# Written by `cargo xtask vm-test` (xtask/src/vm/guest.rs): the kernel \
         matrix's plan.\nset -u\nOUT={}\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/tmp/vm-home TMPDIR=/tmp RUST_BACKTRACE=1 CI={}\nexport PYEBPF_BIN={} \
         PYEBPF_TEST_CACHE={} PYEBPF_TEST_MANIFEST={}\nmkdir -p \"$HOME\" && cd /tmp || exit 1\n: > \"$OUT/steps.tsv\"",
        q(out),
        if ci { "true" } else { "false" },
        q(&bins.pyebpf),
        q(&bins.cache),
        q(&bins.cache.join("interpreters.json")),
    );
    s.push_str(STEP_FUNCTIONS);
    for step in plan(bins) {
        let _ = writeln!(s, "step {} {}", step.name, shell_quote(&step.command));
    }
    s.push_str("exit $failed\n");
    s
}

/// `step NAME CMD…` runs CMD with its output in `$OUT/NAME.log` and records its status and
/// seconds; `stats PYTHON` records a spinning 3.12 for 5 s with `PYEBPF_STATS=1`.
const STEP_FUNCTIONS: &str = r#"failed=0
step() {
  local name=$1; shift
  local t0=$SECONDS
  echo "vm-guest: step $name"
  eval "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/steps.tsv"
  echo "vm-guest: step $name exited $rc after $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || failed=1
}
stats() {
  "$1" -c 'while True: pass' &
  local pid=$!
  sleep 2
  PYEBPF_STATS=1 "$PYEBPF_BIN" record -p "$pid" -d 5 -f collapsed -o /tmp/vm-stats.txt
  local rc=$?
  kill "$pid"
  wait "$pid" 2>/dev/null
  grep -c "python" /tmp/vm-stats.txt
  return $rc
}
"#;

/// Single-quoted for bash.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,".contains(c))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What one kernel's run produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// (step, exit status, seconds) from `steps.tsv`.
    pub steps: Vec<(String, i32, u64)>,
    /// Tests passed and failed (libtest's `test result:` lines).
    pub passed: u64,
    pub failed: u64,
    /// The recording's `eBPF sampling program:` summary line.
    pub program_line: Option<String>,
    /// `variant-load:` lines of the load test (one per variant and record variant).
    pub variant_loads: Vec<String>,
}

impl Outcome {
    /// Reads the files of a finished run in `out`.
    pub fn read(out: &Path) -> Outcome {
        let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
        let mut o = Outcome::default();
        for line in read("steps.tsv").lines() {
            let mut f = line.split('\t');
            if let (Some(name), Some(rc), Some(secs)) = (f.next(), f.next(), f.next()) {
                o.steps.push((
                    name.to_owned(),
                    rc.parse().unwrap_or(-1),
                    secs.parse().unwrap_or(0),
                ));
            }
        }
        let logs: Vec<String> = o.steps.iter().map(|(n, _, _)| format!("{n}.log")).collect();
        for log in &logs {
            for line in read(log).lines() {
                if let Some(rest) = line.strip_prefix("test result: ") {
                    o.passed += count_before(rest, " passed");
                    o.failed += count_before(rest, " failed");
                }
                if let Some(at) = line.find("variant-load: ") {
                    o.variant_loads.push(line[at + 14..].to_owned());
                }
            }
        }
        o.program_line = read("stats.log")
            .lines()
            .find(|l| l.contains("eBPF sampling program:"))
            .map(str::to_owned);
        o
    }

    /// Every step ran and exited 0, and tests ran.
    pub fn passed_all(&self, plan_len: usize) -> bool {
        self.steps.len() == plan_len
            && self.steps.iter().all(|(_, rc, _)| *rc == 0)
            && self.failed == 0
            && self.passed > 0
    }

    /// `variant`, verified instructions and ns per sample of the stats recording.
    pub fn program(&self) -> (String, String, String) {
        let Some(line) = &self.program_line else {
            return ("?".into(), "?".into(), "?".into());
        };
        let variant = line
            .split_once(", variant ")
            .map_or("?", |(_, v)| v.split(" (").next().unwrap_or(v))
            .to_owned();
        let word_before = |word: &str| {
            line.find(word)
                .and_then(|at| line[..at].split_whitespace().next_back())
                .unwrap_or("?")
                .to_owned()
        };
        let insns = if line.contains("instructions verified") {
            word_before(" instructions verified")
        } else {
            "n/a".to_owned()
        };
        (variant, insns, word_before(" ns per sample"))
    }

    /// Verified instructions per loaded variant (the largest over record variants).
    pub fn verified_by_variant(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for l in &self.variant_loads {
            let name = l.split_whitespace().next().unwrap_or("?").to_owned();
            let value = if l.contains(" unsupported") {
                "unsupported".to_owned()
            } else {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("verified_insns="))
                    .unwrap_or("?")
                    .to_owned()
            };
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => {
                    if let (Ok(a), Ok(b)) = (v.parse::<u64>(), value.parse::<u64>())
                        && b > a
                    {
                        *v = value;
                    }
                }
                None => out.push((name, value)),
            }
        }
        out
    }
}

/// The number before `word` in `text` (`3 passed; 0 failed`).
fn count_before(text: &str, word: &str) -> u64 {
    text.find(word)
        .and_then(|at| text[..at].split_whitespace().next_back())
        .and_then(|n| n.trim_end_matches(';').parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bins() -> Binaries {
        Binaries {
            pyebpf: "/w/target/debug/pyebpf".into(),
            unit: "/w/target/debug/deps/pyebpf-abc".into(),
            e2e: "/w/target/debug/deps/e2e-def".into(),
            cache: "/var/cache/pyebpf-test".into(),
            python312: "/root/.pyenv/versions/3.12.1/bin/python3.12".into(),
        }
    }

    #[test]
    fn script_runs_every_step_and_exports_the_test_environment() {
        let s = script(&bins(), Path::new("/w/target/vm-test/5.10"), true);
        for want in [
            "OUT=/w/target/vm-test/5.10",
            "CI=true",
            "PYEBPF_BIN=/w/target/debug/pyebpf",
            "PYEBPF_TEST_MANIFEST=/var/cache/pyebpf-test/interpreters.json",
            "step loads_every_variant_at_every_stack_size_class '/w/target/debug/deps/pyebpf-abc \
             --test-threads=1 --nocapture --exact \
             collect::root_tests::loads_every_variant_at_every_stack_size_class'",
            "step deep_stack_3_12 '/w/target/debug/deps/e2e-def --test-threads=1 --nocapture \
             --exact pyrecord::stacks::deep_stack_3_12'",
            "step stats 'stats /root/.pyenv/versions/3.12.1/bin/python3.12'",
            "step kernel 'uname -r && ls -l /sys/kernel/btf/vmlinux'",
        ] {
            assert!(s.contains(want), "{want} missing from:\n{s}");
        }
        assert_eq!(plan(&bins()).len(), STEPS);
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/a/b-c_1.2"), "/a/b-c_1.2");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn reads_a_finished_run() {
        let dir = std::env::temp_dir().join(format!("xtask-outcome-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("steps.tsv"),
            "kernel\t0\t1\nunit\t0\t80\ne2e\t1\t200\nstats\t0\t9\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("unit.log"),
            "variant-load: bpf_loop unsupported: this kernel cannot run …\n\
             variant-load: bounded stack_bytes=0 kernel_stacks=false verified_insns=n/a translated=900\n\
             test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 300 filtered out; finished in 80.00s\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("e2e.log"),
            "test result: FAILED. 8 passed; 1 failed; 0 ignored; 0 measured; 60 filtered out\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("stats.log"),
            "pyebpf: eBPF sampling program: 2100 ns per sample (mean of 800 runs), 12000 \
             instructions after rewrites, 60000 bytes JIT-compiled, variant bounded (this kernel \
             lacks bpf_loop (Linux 5.17))\n",
        )
        .unwrap();
        let o = Outcome::read(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!((o.passed, o.failed), (20, 1));
        assert!(!o.passed_all(4));
        assert_eq!(o.program(), ("bounded".into(), "n/a".into(), "2100".into()));
        assert_eq!(
            o.verified_by_variant(),
            [
                ("bpf_loop".to_string(), "unsupported".to_string()),
                ("bounded".to_string(), "n/a".to_string())
            ]
        );
    }
}
