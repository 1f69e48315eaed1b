//! The `pyebpf` command line: parses flags with clap, turns them into the library's validated
//! configurations, runs the command and maps errors to one line and an exit code.
//!
//! Exit codes: 0 success; 1 a runtime error or a state of the system that prevents the run
//! (one line on stderr, `pyebpf: …`); 2 a usage error (an unknown flag, a value out of range:
//! also one line).

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
    /// Read a saved profile (`record -o run.pyebpf`): a perf-style report, or render it to any
    /// output format with -f/-o.
    Report(ReportArgs),
    /// Print every sample of a saved profile in the `perf script` text layout.
    Script(ScriptArgs),
    /// Live view of the hottest functions and processes, refreshed every second.
    Top(TopArgs),
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
    #[arg(
        short = 'd',
        long = "duration",
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    duration: Option<f64>,
    /// Samples per second, per CPU.
    #[arg(short = 'r', long = "rate", default_value_t = 99, value_name = "HZ")]
    rate: u64,
    /// Output file, format from its extension (repeatable: several formats of the same run;
    /// default: pyebpf-<time>.<ext> in the current directory).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Vec<PathBuf>,
    /// Output format: flamegraph, collapsed, speedscope, pprof or pyebpf (default: from -o's
    /// extension, else flamegraph). Only with a single -o.
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
    /// Wall clock: Python threads of the targets are sampled off a CPU too (sleeping, blocked,
    /// waiting for a CPU or the GIL), each stack ending in its state (`--wall` is the same).
    #[arg(long, visible_alias = "wall")]
    idle: bool,
    /// With -p: also profile processes the targets start.
    #[arg(short = 's', long)]
    subprocesses: bool,
    /// Bytes of user stack copied per sample with --native (rounded up to 8, 16, 32 or 64 KiB).
    #[arg(long = "stack-size", value_name = "BYTES")]
    stack_size: Option<u32>,
    /// Ring-buffer size in bytes, a power of two (default: a second of samples at the rate,
    /// on every CPU, with the stack copy; at most 32 MiB).
    #[arg(long = "ring-size", value_name = "BYTES")]
    ring_size: Option<u64>,
    /// No progress line.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Show whole Python file names (default: relative to the sys.path entry they were imported
    /// from, as py-spy shows them; saved profiles keep both).
    #[arg(long = "full-filenames")]
    full_filenames: bool,
    /// Under sudo, run COMMAND as root (default: as the user who ran sudo, with their groups).
    #[arg(long = "as-root")]
    as_root: bool,
    /// Command to start and profile, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Args)]
#[allow(clippy::struct_excessive_bools, reason = "clap: one field per flag")]
struct DumpArgs {
    /// Process to dump.
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        required_unless_present = "core",
        conflicts_with = "core"
    )]
    pid: Option<u32>,
    /// Dump a core file (from gcore or the kernel; gzip-compressed too) instead of a process.
    #[arg(long, value_name = "FILE")]
    core: Option<PathBuf>,
    /// With --core: where the process's files are (default /; a container's root for a core of
    /// a containerised process).
    #[arg(long, value_name = "DIR", requires = "core")]
    root: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also print every frame's arguments and local variables (as Python's repr shows them).
    #[arg(short = 'l', long)]
    locals: bool,
    /// With --locals: at most this many characters per value.
    #[arg(
        long = "locals-max-len",
        value_name = "N",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(8..=1_000_000),
        requires = "locals"
    )]
    locals_max_len: u32,
    /// Also native (C) frames, merged with the Python frames. A live process has each thread
    /// stopped in turn, for the time it takes to copy its registers and stack.
    #[arg(short = 'n', long)]
    native: bool,
    /// Stop each thread in turn while its Python stack is read (ptrace): a consistent stack
    /// even for a thread that is running (without it, a stack that changes while it is read
    /// is read again, and shown as torn if it keeps changing).
    #[arg(long, conflicts_with = "core")]
    pause: bool,
}

#[derive(Args)]
#[allow(clippy::struct_excessive_bools, reason = "clap: one field per flag")]
struct ReportArgs {
    /// The saved profile.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Render to this output format instead of a report: flamegraph, collapsed, speedscope,
    /// pprof or pyebpf (default with -o: from its extension).
    #[arg(short = 'f', long = "format", value_name = "FORMAT")]
    format: Option<String>,
    /// Write the rendered format (or the report) to this file instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Group rows by these keys: comm, pid, tid, thread, state, gil, module, function, srcline.
    #[arg(
        short = 's',
        long = "sort",
        value_name = "KEYS",
        value_delimiter = ',',
        default_value = "comm,module,function"
    )]
    sort: Vec<String>,
    /// Also count time in callees (total, "Children"), as perf report --children.
    #[arg(long)]
    children: bool,
    /// Hide rows below this overhead, in percent.
    #[arg(long = "percent-limit", value_name = "PCT", default_value_t = 0.0)]
    percent_limit: f64,
    /// Only samples of these processes.
    #[arg(long = "pid", value_name = "PID", value_delimiter = ',')]
    pids: Vec<u32>,
    /// Only samples of these threads.
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',')]
    tids: Vec<u32>,
    /// Only samples of processes with these names.
    #[arg(long = "comm", value_name = "COMM", value_delimiter = ',')]
    comms: Vec<String>,
    /// Only samples of threads with these names.
    #[arg(long = "thread", value_name = "NAME", value_delimiter = ',')]
    threads: Vec<String>,
    /// Only samples in these thread states (record --idle): on-cpu, runnable, sleeping, blocked,
    /// gil-wait.
    #[arg(long = "state", value_name = "STATE", value_delimiter = ',')]
    states: Vec<String>,
    /// Show call chains under each row: caller (root first) or callee (leaf first).
    #[arg(short = 'g', long = "call-graph", value_name = "ORDER")]
    call_graph: Option<String>,
    /// Print the rows as JSON.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print the rows as CSV.
    #[arg(long)]
    csv: bool,
    /// Show whole Python file names (default: relative to their sys.path entry).
    #[arg(long = "full-filenames")]
    full_filenames: bool,
    /// One row per native address that has no symbol (default: one per module, `[libz.so.1]`).
    #[arg(long)]
    addresses: bool,
}

#[derive(Args)]
struct ScriptArgs {
    /// The saved profile.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Show whole Python file names (default: relative to their sys.path entry).
    #[arg(long = "full-filenames")]
    full_filenames: bool,
}

#[derive(Args)]
#[allow(clippy::struct_excessive_bools, reason = "clap: one field per flag")]
struct TopArgs {
    /// Only these processes (repeatable; default: every process on the host).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Samples per second, per CPU.
    #[arg(short = 'r', long = "rate", default_value_t = 99, value_name = "HZ")]
    rate: u64,
    /// Include native (C/C++/Rust) frames, unwound from a copy of each sample's user stack.
    #[arg(short = 'n', long)]
    native: bool,
    /// Include kernel frames on top of user frames.
    #[arg(short = 'k', long)]
    kernel: bool,
    /// Only samples of threads that hold the GIL.
    #[arg(long)]
    gil: bool,
    /// Wall clock: Python threads are sampled off a CPU too, with their state.
    #[arg(long, visible_alias = "wall")]
    idle: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("PYEBPF_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // One line, like every other error: clap's first line without its `error: `.
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("invalid usage");
            eprintln!(
                "pyebpf: {} (see --help)",
                first.strip_prefix("error: ").unwrap_or(first)
            );
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Record(args) => record(args),
        Command::Dump(args) => dump(&args),
        Command::Report(args) => report(args),
        Command::Script(args) => script(&args),
        Command::Top(args) => top(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `pyebpf script run.pyebpf | head`: the reader left, as with perf, not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pyebpf: {e}");
            if is_usage(e.as_ref()) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Whether an error is a usage error (exit status 2).
fn is_usage(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(c) = e.downcast_ref::<pyebpf::config::ConfigError>() {
        return c.is_usage();
    }
    if let Some(pyebpf::top::TopError::Config(c)) = e.downcast_ref::<pyebpf::top::TopError>() {
        return c.is_usage();
    }
    false
}

fn record(a: RecordArgs) -> Result<(), Box<dyn std::error::Error>> {
    let req = RecordRequest {
        all: a.all,
        pids: a.pids,
        command: a.command,
        duration_s: a.duration,
        rate_hz: a.rate,
        outputs: a.output,
        format: a.format,
        native: a.native,
        kernel: a.kernel,
        threads: a.threads,
        gil: a.gil,
        idle: a.idle,
        subprocesses: a.subprocesses,
        stack_bytes: a.stack_size,
        ring_bytes: a.ring_size,
        command_as_root: a.as_root,
        progress: !a.quiet && std::io::stderr().is_terminal(),
        full_filenames: a.full_filenames,
    };
    let cfg = RecordConfig::new(req, &pyebpf::record::timestamp_for_file_name())?;
    pyebpf::preflight::check()?;
    pyebpf::record::run(&cfg, &std::env::args().collect::<Vec<_>>())?;
    Ok(())
}

fn dump(a: &DumpArgs) -> Result<(), Box<dyn std::error::Error>> {
    use pyebpf::dump::{DumpOptions, DumpTarget};
    let target = match (&a.core, a.pid) {
        (Some(path), _) => DumpTarget::Core {
            path: path.clone(),
            root: a.root.clone().unwrap_or_else(|| PathBuf::from("/")),
        },
        (None, Some(pid)) => DumpTarget::Pid(pid),
        (None, None) => return Err("dump needs -p PID or --core FILE".into()),
    };
    let opts = DumpOptions {
        target,
        json: a.json,
        locals: a.locals.then(|| pyebpf::python::values::ValueLimits {
            max_len: a.locals_max_len as usize,
            ..Default::default()
        }),
        native: a.native,
        pause: a.pause,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    pyebpf::dump::run(&opts, &mut out)?;
    Ok(())
}

/// What `report` writes: a profile format, or the report itself.
enum ReportView {
    Format(pyebpf::output::Format),
    Report(pyebpf::report::ReportConfig),
}

fn report(a: ReportArgs) -> Result<(), Box<dyn std::error::Error>> {
    use pyebpf::output::Format;
    let format = match (&a.format, &a.output) {
        (Some(name), _) => Some(Format::from_name(name).ok_or_else(|| {
            format!(
                "unknown format '{name}': use flamegraph, collapsed, speedscope, pprof or pyebpf"
            )
        })?),
        (None, Some(path)) => Format::from_path(path),
        (None, None) => None,
    };
    let opts = pyebpf::report::ReportOptions {
        sort: a.sort,
        children: a.children,
        percent_limit: a.percent_limit,
        pids: a.pids,
        tids: a.tids,
        comms: a.comms,
        threads: a.threads,
        states: a.states,
        call_graph: a.call_graph,
        json: a.json,
        csv: a.csv,
        color: a.output.is_none() && std::io::stdout().is_terminal(),
        source: a.file.display().to_string(),
        full_filenames: a.full_filenames,
        addresses: a.addresses,
    };
    // A usage error is reported before the file is read (a format's output has no options).
    let view = match format {
        Some(f) => ReportView::Format(f),
        None => ReportView::Report(pyebpf::report::ReportConfig::new(&opts)?),
    };
    // The output is resolved (and refused) before the saved file is read.
    let out = pyebpf::output::OutputFile::open(a.output.as_deref().unwrap_or("-".as_ref()))?;
    // Writing the saved format again needs every sample, not only their counts.
    let mut profile = load(&a.file, format == Some(Format::Pyebpf))?;
    if a.full_filenames {
        profile.file_names = pyebpf::profile::FileNames::Full;
    }
    let written = match &view {
        ReportView::Format(format) => out.write(|w| format.render(&profile, w)),
        ReportView::Report(cfg) => out.write(|w| pyebpf::report::render(&profile, cfg, w)),
    };
    written.map_err(|e| {
        if out.is_stdout() {
            e.into()
        } else {
            format!("cannot write {}: {e}", out.path().display()).into()
        }
    })
}

/// Loads a saved profile; an incomplete one (a run that was killed) is said so on stderr.
fn load(
    path: &std::path::Path,
    timeline: bool,
) -> Result<pyebpf::profile::Profile, pyebpf::saved::LoadError> {
    let loaded = pyebpf::saved::load_with(path, timeline)?;
    if !loaded.complete {
        eprintln!(
            "pyebpf: {}: incomplete (the run did not finish writing it): {} samples up to its last complete chunk; lost samples and errors unknown",
            path.display(),
            loaded.profile.sample_count()
        );
    }
    Ok(loaded.profile)
}

fn script(a: &ScriptArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut profile = load(&a.file, true)?;
    if a.full_filenames {
        profile.file_names = pyebpf::profile::FileNames::Full;
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    pyebpf::report::script::render(&profile, &mut out)?;
    Ok(std::io::Write::flush(&mut out)?)
}

fn top(a: TopArgs) -> Result<(), Box<dyn std::error::Error>> {
    let req = pyebpf::top::TopRequest {
        pids: a.pids,
        rate_hz: a.rate,
        native: a.native,
        kernel: a.kernel,
        gil: a.gil,
        idle: a.idle,
    };
    pyebpf::top::require_terminal()?;
    let cfg = pyebpf::top::TopConfig::new(&req)?;
    pyebpf::preflight::check()?;
    pyebpf::top::run(&cfg)?;
    Ok(())
}
