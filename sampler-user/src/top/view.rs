//! What `top` draws: the header, the function view and the process view, as plain text lines
//! fitted to the terminal, and what each key does.
//!
//! Owns: [`Ui`] (view, sort column per view, pause), the key map ([`action`]), the sort
//! orders and [`render`], which turns a [`Snapshot`] into at most `height` lines of at most
//! `width` cells. Pure: no terminal access, so it is tested on hand-built snapshots.
//! Only ASCII is drawn by us; names from the profiled processes have control characters
//! replaced (see [`super::model::clean`]) and are cut by their display width.

use std::cmp::Reverse;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::model::{FuncRow, Label, ProcRow, Snapshot};

/// Columns of the function view that can be sorted on (keys `1`..`4`).
pub const FUNC_SORTS: [&str; 4] = ["%Own", "%Total", "OwnTime", "TotalTime"];
/// Columns of the process view that can be sorted on (keys `1`..`4`).
pub const PROC_SORTS: [&str; 4] = ["CPU%", "Samples", "PID", "COMM"];
/// Lines above the table: two header lines, a blank line, the column titles.
const HEADER_LINES: usize = 4;
/// The key help of the header.
const KEYS: &str = "q quit  Tab/v view  1-4/s sort  space pause  r reset";

/// Which table is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// One row per function (and line): own and total.
    Functions,
    /// One row per process: CPU %, samples, hottest Python function.
    Processes,
}

/// The state of the display that keys change.
#[derive(Clone, Debug)]
pub struct Ui {
    /// The table shown.
    pub view: View,
    /// Sort column of the function view (index into [`FUNC_SORTS`]).
    pub func_sort: usize,
    /// Sort column of the process view (index into [`PROC_SORTS`]).
    pub proc_sort: usize,
    /// The display is frozen (sampling goes on).
    pub paused: bool,
    /// What is sampled, for the header: `all processes` or `pid 12, 34`, and the options.
    pub mode: String,
}

impl Ui {
    /// The start state: function view sorted by %Own.
    pub fn new(mode: String) -> Self {
        Ui {
            view: View::Functions,
            func_sort: 0,
            proc_sort: 0,
            paused: false,
            mode,
        }
    }

    /// Applies a key's action (except [`Action::Quit`] and [`Action::Reset`], which the caller
    /// handles); returns whether the screen must be redrawn.
    pub fn apply(&mut self, a: Action) -> bool {
        let sort = match self.view {
            View::Functions => &mut self.func_sort,
            View::Processes => &mut self.proc_sort,
        };
        match a {
            Action::SwitchView => {
                self.view = match self.view {
                    View::Functions => View::Processes,
                    View::Processes => View::Functions,
                };
            }
            Action::Sort(i) if i < FUNC_SORTS.len() => *sort = i,
            Action::NextSort => *sort = (*sort + 1) % FUNC_SORTS.len(),
            Action::Pause => self.paused = !self.paused,
            Action::Reset => {}
            Action::Quit | Action::Sort(_) | Action::Nothing => return false,
        }
        true
    }
}

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `q`, `Q`, Ctrl-C: leave.
    Quit,
    /// Tab, `v`: the other view.
    SwitchView,
    /// `1`..`4`: sort on that column (0-based here).
    Sort(usize),
    /// `s`: the next sort column.
    NextSort,
    /// Space: freeze or unfreeze the display.
    Pause,
    /// `r`: forget the accumulated counts.
    Reset,
    /// Any other key.
    Nothing,
}

/// The action of a key event (key releases and repeats of other keys do nothing).
pub fn action(k: &KeyEvent) -> Action {
    if k.kind == KeyEventKind::Release {
        return Action::Nothing;
    }
    let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
    match k.code {
        KeyCode::Char('c' | 'C') if ctrl => Action::Quit,
        _ if ctrl => Action::Nothing,
        KeyCode::Char('q' | 'Q') => Action::Quit,
        KeyCode::Tab | KeyCode::BackTab | KeyCode::Char('v' | 'V') => Action::SwitchView,
        KeyCode::Char(c @ '1'..='4') => Action::Sort(c as usize - '1' as usize),
        KeyCode::Char('s' | 'S') => Action::NextSort,
        KeyCode::Char(' ') => Action::Pause,
        KeyCode::Char('r' | 'R') => Action::Reset,
        _ => Action::Nothing,
    }
}

/// Sorts function rows on column `col` of [`FUNC_SORTS`], largest first, ties by label.
pub fn sort_funcs(rows: &mut [FuncRow], col: usize) {
    rows.sort_by(|a, b| {
        let key = |r: &FuncRow| match col {
            1 => (r.total, r.total_acc, r.own),
            2 => (r.own_acc, r.own, r.total_acc),
            3 => (r.total_acc, r.total, r.own_acc),
            _ => (r.own, r.own_acc, r.total),
        };
        key(b)
            .cmp(&key(a))
            .then_with(|| a.label.name.cmp(&b.label.name))
            .then_with(|| a.label.location.cmp(&b.label.location))
    });
}

/// Sorts process rows on column `col` of [`PROC_SORTS`]: CPU % and samples largest first,
/// PID and COMM ascending; ties by pid.
pub fn sort_procs(rows: &mut [ProcRow], col: usize) {
    match col {
        1 => rows.sort_by_key(|r| (Reverse(r.samples_acc), Reverse(r.samples), r.pid)),
        2 => rows.sort_by_key(|r| r.pid),
        3 => rows.sort_by(|a, b| a.comm.cmp(&b.comm).then(a.pid.cmp(&b.pid))),
        _ => rows.sort_by_key(|r| (Reverse(r.samples), Reverse(r.samples_acc), r.pid)),
    }
}

/// How a line is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Normal text.
    Plain,
    /// Reverse video (the column titles).
    Reverse,
}

/// One screen line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The text, at most the screen width.
    pub text: String,
    /// How to draw it.
    pub style: Style,
}

/// Terminal cells taken by `c` (unicode-width: 2 for East Asian wide characters and emoji);
/// control characters, already replaced in names, count 1.
fn char_width(c: char) -> usize {
    unicode_width::UnicodeWidthChar::width(c).unwrap_or(1)
}

/// Terminal cells taken by `s`.
pub fn width_of(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

/// The longest start of `s` that takes at most `w` cells.
pub fn truncate(s: &str, w: usize) -> String {
    let mut used = 0;
    let mut out = String::new();
    for c in s.chars() {
        used += char_width(c);
        if used > w {
            break;
        }
        out.push(c);
    }
    out
}

/// The longest end of `s` that takes at most `w` cells.
fn tail(s: &str, w: usize) -> String {
    let mut used = 0;
    let mut out: Vec<char> = Vec::new();
    for c in s.chars().rev() {
        used += char_width(c);
        if used > w {
            break;
        }
        out.push(c);
    }
    out.into_iter().rev().collect()
}

/// `name (location)` in at most `w` cells: when too wide, the location loses its start
/// (`name (...dir/file.py:12)`), then the whole text is cut.
pub fn fit_label(label: &Label, w: usize) -> String {
    let full = label.text();
    if width_of(&full) <= w {
        return full;
    }
    let room = w.saturating_sub(width_of(&label.name) + " (...)".len());
    // Keep at least a file name and line's worth of the location.
    if !label.location.is_empty() && room >= 12 {
        return format!("{} (...{})", label.name, tail(&label.location, room));
    }
    truncate(&full, w)
}

/// `h:mm:ss`.
fn hms(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn plain(text: String) -> Line {
    Line {
        text,
        style: Style::Plain,
    }
}

/// The two header lines and the blank line below them.
fn header(snap: &Snapshot, ui: &Ui) -> Vec<Line> {
    let (view, sort) = match ui.view {
        View::Functions => ("Functions", FUNC_SORTS[ui.func_sort.min(3)]),
        View::Processes => ("Processes", PROC_SORTS[ui.proc_sort.min(3)]),
    };
    vec![
        plain(format!(
            "pyebpf top - {} - {} elapsed - {:.0} samples/s ({} Hz x {} CPUs) - lost {} - Python processes: {}",
            ui.mode,
            hms(snap.elapsed),
            snap.samples_per_s(),
            snap.rate_hz,
            snap.cpus,
            snap.lost_samples,
            snap.python_procs
        )),
        plain(format!(
            "{view} sorted by {sort}{} - keys: {KEYS}",
            if ui.paused { " [PAUSED]" } else { "" }
        )),
        plain(String::new()),
    ]
}

/// Width of the State column (`--idle`): `gil-wait 100%`.
const STATE_WIDTH: usize = 13;

/// The State cell of a function row: where most of its own time went since the start
/// (`sleeping 62%`).
fn state_cell(r: &super::model::FuncRow) -> String {
    r.main_state().map_or_else(
        || "-".to_string(),
        |(s, pct)| format!("{} {pct:.0}%", s.as_str()),
    )
}

/// The function table: titles, then at most `rows` rows, in `w` cells. With `--idle` a State
/// column says where each function's own time went.
fn func_table(snap: &Snapshot, ui: &Ui, w: usize, rows: usize, lines: &mut Vec<Line>) {
    let state_title = if snap.idle {
        format!("{:<STATE_WIDTH$}  ", "State")
    } else {
        String::new()
    };
    lines.push(Line {
        text: format!(
            "{:>7}  {:>7}  {:>9}  {:>10}  {state_title}Function (file:line or module)",
            "%Own", "%Total", "OwnTime", "TotalTime"
        ),
        style: Style::Reverse,
    });
    let mut funcs = snap.funcs.clone();
    sort_funcs(&mut funcs, ui.func_sort);
    let fixed = 7 + 2 + 7 + 2 + 9 + 2 + 10 + 2 + if snap.idle { STATE_WIDTH + 2 } else { 0 };
    for r in funcs.iter().take(rows) {
        let state = if snap.idle {
            format!("{:<STATE_WIDTH$}  ", state_cell(r))
        } else {
            String::new()
        };
        lines.push(plain(format!(
            "{:>6.1}%  {:>6.1}%  {:>8.2}s  {:>9.2}s  {state}{}",
            snap.percent(r.own),
            snap.percent(r.total),
            snap.seconds(r.own_acc),
            snap.seconds(r.total_acc),
            fit_label(&r.label, w.saturating_sub(fixed))
        )));
    }
}

/// The process table: titles, then at most `rows` rows, in `w` cells.
fn proc_table(snap: &Snapshot, ui: &Ui, w: usize, rows: usize, lines: &mut Vec<Line>) {
    lines.push(Line {
        text: format!(
            "{:>7}  {:<16}  {:>7}  {:>9}  {:>9}  Hottest Python function",
            "PID", "COMM", "CPU%", "Samples", "CPUTime"
        ),
        style: Style::Reverse,
    });
    let mut procs = snap.procs.clone();
    sort_procs(&mut procs, ui.proc_sort);
    let fixed = 7 + 2 + 16 + 2 + 7 + 2 + 9 + 2 + 9 + 2;
    for r in procs.iter().take(rows) {
        let comm = truncate(&r.comm, 16);
        let pad = 16usize.saturating_sub(width_of(&comm));
        let hottest = r.hottest.as_ref().map_or_else(
            || "-".to_string(),
            |l| fit_label(l, w.saturating_sub(fixed)),
        );
        lines.push(plain(format!(
            "{:>7}  {comm}{:pad$}  {:>6.1}%  {:>9}  {:>8.2}s  {hottest}",
            r.pid,
            "",
            snap.cpu_percent(r.samples),
            r.samples_acc,
            snap.seconds(r.samples_acc),
        )));
    }
}

/// The screen for `snap` in a `width` × `height` terminal.
pub fn render(snap: &Snapshot, ui: &Ui, width: u16, height: u16) -> Vec<Line> {
    let (w, h) = (usize::from(width), usize::from(height));
    let mut lines = header(snap, ui);
    let rows = h.saturating_sub(HEADER_LINES);
    let empty = match ui.view {
        View::Functions => {
            func_table(snap, ui, w, rows, &mut lines);
            snap.funcs.is_empty()
        }
        View::Processes => {
            proc_table(snap, ui, w, rows, &mut lines);
            snap.procs.is_empty()
        }
    };
    if empty && rows > 0 {
        lines.push(plain(
            if snap.ready {
                "(no samples)"
            } else {
                "(collecting samples...)"
            }
            .to_string(),
        ));
    }
    lines.truncate(h);
    for l in &mut lines {
        if width_of(&l.text) > w {
            l.text = truncate(&l.text, w);
        }
    }
    lines
}
