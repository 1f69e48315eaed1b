//! The `pyebpf` command line: parses flags with clap, turns them into the library's validated
//! configurations, runs the command and maps errors to one line and an exit code.
//!
//! Exit codes: 0 success; 1 a runtime or user error (one line on stderr, `pyebpf: …`);
//! 2 a usage error (clap).

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use pyebpf::config::{RecordConfig, RecordRequest};

/// A host-wide sampling profiler for Python, built on eBPF.
#[derive(Parser)]
#[command(name = "pyebpf", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sample CPUs and write a profile (flame graph by default).
    Record(RecordArgs),
    /// Print the Python stack of every thread of a process, now (no eBPF needed).
    Dump(DumpArgs),
}

#[derive(Args)]
#[allow(clippy::struct_excessive_bools, reason = "clap: one field per flag")]
struct RecordArgs {
    /// Profile every process on the host.
    #[arg(short = 'a', long)]
    all: bool,
    /// Profile this process (repeatable).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Seconds to sample (default: until Ctrl-C, or until COMMAND exits).
    #[arg(short = 'd', long = "duration", value_name = "SECS")]
    duration: Option<f64>,
    /// Samples per second, per CPU.
    #[arg(short = 'r', long = "rate", default_value_t = 99, value_name = "HZ")]
    rate: u64,
    /// Output file (default: pyebpf-<time>.<ext> in the current directory).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Output format: flamegraph, collapsed or speedscope (default: from -o's extension, else
    /// flamegraph).
    #[arg(short = 'f', long = "format", value_name = "FORMAT")]
    format: Option<String>,
    /// Include native (C/C++/Rust) frames, unwound from a copy of each sample's user stack.
    #[arg(short = 'n', long)]
    native: bool,
    /// Include kernel frames on top of user frames.
    #[arg(short = 'k', long)]
    kernel: bool,
    /// Add a level per thread under each process (Python threads by their `threading` name).
    #[arg(short = 't', long)]
    threads: bool,
    /// Only samples of threads that hold the GIL (a free-threaded process running without a
    /// GIL is reported and excluded).
    #[arg(long)]
    gil: bool,
    /// With -p: also profile processes the targets start.
    #[arg(short = 's', long)]
    subprocesses: bool,
    /// Bytes of user stack copied per sample with --native (rounded up to 8, 16, 32 or 64 KiB).
    #[arg(long = "stack-size", value_name = "BYTES")]
    stack_size: Option<u32>,
    /// No progress line.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Command to start and profile, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Args)]
struct DumpArgs {
    /// Process to dump.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pid: u32,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("PYEBPF_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(args) => record(args),
        Command::Dump(args) => dump(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pyebpf: {e}");
            ExitCode::FAILURE
        }
    }
}

fn record(a: RecordArgs) -> Result<(), Box<dyn std::error::Error>> {
    let req = RecordRequest {
        all: a.all,
        pids: a.pids,
        command: a.command,
        duration_s: a.duration,
        rate_hz: a.rate,
        output: a.output,
        format: a.format,
        native: a.native,
        kernel: a.kernel,
        threads: a.threads,
        gil: a.gil,
        subprocesses: a.subprocesses,
        stack_bytes: a.stack_size,
        progress: !a.quiet && std::io::stderr().is_terminal(),
    };
    let cfg = RecordConfig::new(req, &pyebpf::record::timestamp_for_file_name())?;
    pyebpf::preflight::check()?;
    pyebpf::record::run(&cfg, &std::env::args().collect::<Vec<_>>())?;
    Ok(())
}

fn dump(a: &DumpArgs) -> Result<(), Box<dyn std::error::Error>> {
    let opts = pyebpf::python::dump::DumpOptions {
        pid: a.pid,
        json: a.json,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    pyebpf::python::dump::run(&opts, &mut out)?;
    Ok(())
}
