//! `pyebpf top`: a live, host-wide (or `-p PID`) view of where CPU time goes, refreshed every
//! second.
//!
//! Owns: the `top` command — its configuration ([`TopRequest`] from the CLI, validated into a
//! [`TopConfig`]), driving a `record` sampling
//! [`Session`](crate::record::session::Session) (same collector, Python stage and stack
//! builder as `record`), taking the samples of each refresh window out of the profile (so
//! memory stays bounded on a long run) and the terminal loop: keys, refresh, redraw.
//! The numbers are in [`model`], the drawing in [`view`], the terminal state in [`term`].
//!
//! `top` needs a terminal on stdout; otherwise it fails with one line and `record` is the
//! tool. Every way out restores the terminal: `q`, Ctrl-C (a key in raw mode), SIGINT or
//! SIGTERM from elsewhere (the session stops), an error, a panic (hook).

pub mod model;
mod term;
#[cfg(test)]
mod tests;
pub mod view;

use std::io::IsTerminal as _;
use std::time::Duration;

use crossterm::event::{self, Event};

use crate::config::{ConfigError, Target};
use crate::profile::Profile;
use crate::record::RecordError;
use crate::record::session::{Flow, Session, SessionConfig, Tick};
use model::{Aggregator, Snapshot};
use view::{Action, Ui};

/// How often the display is refreshed.
pub const REFRESH: Duration = Duration::from_secs(1);
/// How often keys are read (and the refresh checked): the session wakes this often for `top`.
const KEYS_EVERY: Duration = Duration::from_millis(100);
/// Most input events handled per tick (a flood of input cannot starve sampling).
const MAX_EVENTS_PER_TICK: usize = 64;

/// What `top` samples (from the CLI flags).
#[derive(Clone, Debug, Default)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "one field per CLI flag: the request mirrors the command line"
)]
pub struct TopRequest {
    /// `-p`: only these processes (empty: the whole host).
    pub pids: Vec<u32>,
    /// Samples per second, per CPU.
    pub rate_hz: u64,
    /// Include native frames.
    pub native: bool,
    /// Include kernel frames.
    pub kernel: bool,
    /// Only samples of threads holding the GIL.
    pub gil: bool,
    /// Python threads off a CPU too (`--idle`).
    pub idle: bool,
}

/// A validated `top` run: the sampling session and the header's mode line.
#[derive(Clone, Debug)]
pub struct TopConfig {
    session: SessionConfig,
    mode: String,
}

impl TopConfig {
    /// Validates a request: what a user can get wrong before sampling (a pid that does not
    /// exist, a rate out of range) is a one-line error here, as `record`'s
    /// [`crate::config::RecordConfig::new`].
    pub fn new(req: &TopRequest) -> Result<Self, TopError> {
        crate::config::check_pids(&req.pids)?;
        crate::config::check_rate(req.rate_hz)?;
        Ok(TopConfig {
            session: req.session(),
            mode: req.mode(),
        })
    }
}

impl TopRequest {
    /// The sampling session `top` runs.
    fn session(&self) -> SessionConfig {
        SessionConfig {
            target: if self.pids.is_empty() {
                Target::All
            } else {
                Target::Pids(self.pids.clone())
            },
            duration: None,
            rate_hz: self.rate_hz,
            native: self.native,
            kernel: self.kernel,
            threads: false,
            gil: self.gil,
            idle: self.idle,
            subprocesses: false,
            stack_bytes: if self.native {
                sampler_common::DEFAULT_STACK_BYTES
            } else {
                0
            },
            ring_bytes: 0,
            run_as: None,
        }
    }

    /// What the header says is sampled: `all processes` or `pid 12, 34`, and the options.
    fn mode(&self) -> String {
        let mut m = if self.pids.is_empty() {
            "all processes".to_string()
        } else {
            let list: Vec<String> = self.pids.iter().map(u32::to_string).collect();
            format!("pid {}", list.join(", "))
        };
        for (on, name) in [
            (self.native, "native"),
            (self.kernel, "kernel"),
            (self.gil, "gil"),
            (self.idle, "idle"),
        ] {
            if on {
                m.push_str(" +");
                m.push_str(name);
            }
        }
        m
    }
}

/// Why `top` stopped with an error. Displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// stdout is not a terminal.
    #[error("top needs a terminal; use record")]
    NotATerminal,
    /// A flag is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Sampling could not start or failed.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The terminal could not be set up or written.
    #[error("terminal: {0}")]
    Terminal(std::io::Error),
}

/// Fails unless stdout is a terminal.
pub fn require_terminal() -> Result<(), TopError> {
    if std::io::stdout().is_terminal() {
        Ok(())
    } else {
        Err(TopError::NotATerminal)
    }
}

/// The live state between ticks.
struct App {
    agg: Aggregator,
    ui: Ui,
    /// What is on screen (frozen while paused).
    shown: Snapshot,
    last_refresh: Duration,
    drawn: bool,
}

impl App {
    /// Handles pending keys, refreshes once a second and redraws when something changed.
    fn tick(
        &mut self,
        profile: &mut Profile,
        tick: &Tick,
        screen: &mut term::Screen,
    ) -> std::io::Result<Flow> {
        let mut redraw = !self.drawn;
        if !self.shown.ready {
            // The header until the first window: what is sampled and for how long.
            self.shown.rate_hz = profile.meta.rate_hz;
            self.shown.cpus = profile.meta.cpus;
            self.shown.elapsed = tick.elapsed;
        }
        for _ in 0..MAX_EVENTS_PER_TICK {
            if !event::poll(Duration::ZERO)? {
                break;
            }
            match event::read()? {
                Event::Key(k) => match view::action(&k) {
                    Action::Quit => return Ok(Flow::Stop),
                    Action::Reset => {
                        self.agg.reset();
                        redraw = true;
                    }
                    a => redraw |= self.ui.apply(a),
                },
                Event::Resize(..) => redraw = true,
                _ => {}
            }
        }
        if tick.elapsed >= self.last_refresh + REFRESH {
            // Sampling and counting go on while paused; only the display is frozen.
            let samples = profile.take_counts();
            let snap = self.agg.window(
                profile,
                &samples,
                tick.elapsed.saturating_sub(self.last_refresh),
                tick.elapsed,
                tick.lost_samples,
            );
            self.last_refresh = tick.elapsed;
            if !self.ui.paused {
                self.shown = snap;
                redraw = true;
            }
        }
        if redraw {
            let (w, h) = term::Screen::size();
            screen.draw(&view::render(&self.shown, &self.ui, w, h), h)?;
            self.drawn = true;
        }
        Ok(Flow::Continue)
    }
}

/// Runs `top` until `q`, Ctrl-C, SIGINT or SIGTERM.
pub fn run(cfg: &TopConfig) -> Result<(), TopError> {
    require_terminal()?;
    eprintln!("pyebpf: top: loading the eBPF program...");
    crate::record::tune_allocator();
    let mut session = Session::start(cfg.session.clone(), &[], false)?;
    let mut app = App {
        agg: Aggregator::default(),
        ui: Ui::new(cfg.mode.clone()),
        shown: Snapshot::default(),
        last_refresh: Duration::ZERO,
        drawn: false,
    };
    let mut screen = term::Screen::enter().map_err(TopError::Terminal)?;
    let mut failed = None;
    session.run(Some(KEYS_EVERY), |profile, _, tick| {
        app.tick(profile, tick, &mut screen).unwrap_or_else(|e| {
            failed = Some(e);
            Flow::Stop
        })
    });
    drop(screen);
    session.finish()?;
    failed.map_or(Ok(()), |e| Err(TopError::Terminal(e)))
}
