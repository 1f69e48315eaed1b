//! Unit tests of `top`'s numbers and drawing on hand-built profiles: self and total per
//! function in a window and accumulated, per-process CPU % and hottest Python function, sort
//! orders, keys, and fitting the terminal's width and height.

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::model::{Aggregator, Label, PROC_LINGER, Snapshot, clean};
use super::view::{
    self, Action, Style, Ui, View, fit_label, render, sort_funcs, sort_procs, truncate, width_of,
};
use crate::profile::{Frame, FrameKind, GilState, NamedSample, Profile, RunMeta};

const SEC: Duration = Duration::from_secs(1);

fn profile(rate_hz: u64) -> Profile {
    Profile::new(RunMeta {
        rate_hz,
        cpus: 2,
        ..RunMeta::default()
    })
}

fn py(name: &str, line: u32) -> Frame {
    Frame {
        kind: FrameKind::Python,
        name: name.into(),
        module: None,
        file: Some("/app/w.py".into()),
        short_file: None,
        line: Some(line),
    }
}

/// Adds `n` samples of process `pid` (`comm`) with `frames` below its root.
fn add(p: &mut Profile, pid: u32, comm: &str, frames: &[Frame], n: usize) {
    let mut ids = vec![p.intern_frame(Frame::new(FrameKind::Process, format!("{comm} ({pid})")))];
    ids.extend(frames.iter().map(|f| p.intern_frame(f.clone())));
    let stack = p.intern_stack(&ids);
    for _ in 0..n {
        p.add_sample(NamedSample {
            stack,
            time_ns: 0,
            pid,
            tid: pid,
            cpu: 0,
            comm: comm.into(),
            thread_name: comm.into(),
            gil: GilState::Unknown,
            state: crate::profile::ThreadState::OnCpu,
            weight: 1,
        });
    }
}

/// One window of everything in `p`, `len` long, ending at `at`.
fn window(agg: &mut Aggregator, p: &mut Profile, len: Duration, at: Duration) -> Snapshot {
    let samples = p.take_counts();
    agg.window(p, &samples, len, at, 7)
}

fn row<'a>(s: &'a Snapshot, name: &str) -> Option<&'a super::model::FuncRow> {
    s.funcs.iter().find(|r| &*r.label.name == name)
}

/// main → f → g ×3, main → f ×1, main → r → r (recursion) ×1 in pid 1; pid 2 without Python
/// frames ×2.
fn scene(p: &mut Profile) {
    add(p, 1, "python3", &[py("main", 1), py("f", 2), py("g", 3)], 3);
    add(p, 1, "python3", &[py("main", 1), py("f", 2)], 1);
    add(p, 1, "python3", &[py("main", 1), py("r", 4), py("r", 4)], 1);
    add(p, 2, "cc1", &[], 2);
}

#[test]
fn self_and_total_per_function_in_a_window() {
    let mut p = profile(100);
    scene(&mut p);
    let mut agg = Aggregator::default();
    let s = window(&mut agg, &mut p, SEC, SEC);
    assert_eq!(s.samples, 7);
    assert_eq!(s.lost_samples, 7);
    assert_eq!(s.python_procs, 1);
    let own_total = |name| {
        let r = row(&s, name).unwrap_or_else(|| panic!("no row {name}: {:?}", s.funcs));
        (r.own, r.total)
    };
    assert_eq!(own_total("g"), (3, 3));
    assert_eq!(own_total("f"), (1, 4));
    assert_eq!(own_total("main"), (0, 5));
    // Recursion: one sample counts once in total.
    assert_eq!(own_total("r"), (1, 1));
    // A process without frames below its root is its own row; a root above frames is not.
    assert_eq!(own_total("cc1 (2) [no Python frames]"), (2, 2));
    assert!(row(&s, "python3 (1) [no Python frames]").is_none());
    // Own sums to every sample.
    assert_eq!(s.funcs.iter().map(|r| r.own).sum::<u64>(), 7);
    assert!((s.percent(3) - 300.0 / 7.0).abs() < 1e-9);
    assert_eq!(row(&s, "g").unwrap().label.location.as_ref(), "/app/w.py:3");
}

#[test]
fn accumulated_counts_survive_windows_and_reset() {
    let mut p = profile(100);
    scene(&mut p);
    let mut agg = Aggregator::default();
    window(&mut agg, &mut p, SEC, SEC);
    add(
        &mut p,
        1,
        "python3",
        &[py("main", 1), py("f", 2), py("g", 3)],
        2,
    );
    let s = window(&mut agg, &mut p, SEC, 2 * SEC);
    let g = row(&s, "g").unwrap();
    assert_eq!((g.own, g.total, g.own_acc, g.total_acc), (2, 2, 5, 5));
    // f had no sample of its own in this window: 0 % now, its time stays.
    let f = row(&s, "f").unwrap();
    assert_eq!((f.own, f.total, f.own_acc, f.total_acc), (0, 2, 1, 6));
    assert!((s.seconds(f.total_acc) - 0.06).abs() < 1e-9);
    assert_eq!(s.samples, 2);
    agg.reset();
    let s = window(&mut agg, &mut p, SEC, 3 * SEC);
    assert!(s.funcs.is_empty(), "{:?}", s.funcs);
    assert!(s.procs.is_empty(), "{:?}", s.procs);
}

#[test]
fn per_process_cpu_and_hottest_python_function() {
    let mut p = profile(100);
    scene(&mut p);
    let mut agg = Aggregator::default();
    let s = window(&mut agg, &mut p, Duration::from_millis(500), SEC);
    let proc1 = s.procs.iter().find(|r| r.pid == 1).unwrap();
    assert_eq!((proc1.samples, proc1.samples_acc), (5, 5));
    assert_eq!(proc1.comm, "python3");
    // 5 samples in 0.5 s at 100 Hz: 10 % of one CPU.
    assert!((s.cpu_percent(proc1.samples) - 10.0).abs() < 1e-9);
    assert_eq!(proc1.hottest.as_ref().unwrap().name.as_ref(), "g");
    let proc2 = s.procs.iter().find(|r| r.pid == 2).unwrap();
    assert_eq!(proc2.hottest, None);
    assert!((s.cpu_percent(2) - 4.0).abs() < 1e-9);

    // A window where pid 1 runs only r: r becomes its hottest; an idle window keeps it.
    add(&mut p, 1, "python3", &[py("main", 1), py("r", 4)], 3);
    add(
        &mut p,
        1,
        "python3",
        &[py("main", 1), py("f", 2), py("g", 3)],
        2,
    );
    let s = window(&mut agg, &mut p, SEC, 2 * SEC);
    let proc1 = s.procs.iter().find(|r| r.pid == 1).unwrap();
    assert_eq!(proc1.hottest.as_ref().unwrap().name.as_ref(), "r");
    assert_eq!((proc1.samples, proc1.samples_acc), (5, 10));
    let s = window(&mut agg, &mut p, SEC, 3 * SEC);
    let proc1 = s.procs.iter().find(|r| r.pid == 1).unwrap();
    assert_eq!(proc1.samples, 0);
    assert_eq!(proc1.hottest.as_ref().unwrap().name.as_ref(), "r");
    assert_eq!(s.python_procs, 0);

    // Not sampled for longer than PROC_LINGER: gone.
    let s = window(&mut agg, &mut p, SEC, 3 * SEC + PROC_LINGER + SEC);
    assert!(s.procs.is_empty(), "{:?}", s.procs);
}

#[test]
fn sort_orders() {
    let mut p = profile(100);
    scene(&mut p);
    let mut agg = Aggregator::default();
    window(&mut agg, &mut p, SEC, SEC);
    // Second window: only main → r, so r leads the window and g the accumulated own time.
    add(&mut p, 1, "python3", &[py("main", 1), py("r", 4)], 1);
    let s = window(&mut agg, &mut p, SEC, 2 * SEC);
    let order = |col| {
        let mut rows = s.funcs.clone();
        sort_funcs(&mut rows, col);
        rows.iter()
            .map(|r| r.label.name.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(order(0)[0], "r");
    assert_eq!(order(1)[..2], ["main", "r"]);
    // OwnTime: r and cc1 tie at 2 samples; r has more in this window.
    assert_eq!(order(2)[..3], ["g", "r", "cc1 (2) [no Python frames]"]);
    assert_eq!(order(3)[..3], ["main", "f", "g"]);

    let mut procs = s.procs.clone();
    let pids = |rows: &[super::model::ProcRow]| rows.iter().map(|r| r.pid).collect::<Vec<_>>();
    sort_procs(&mut procs, 0);
    assert_eq!(pids(&procs), [1, 2]);
    sort_procs(&mut procs, 2);
    assert_eq!(pids(&procs), [1, 2]);
    sort_procs(&mut procs, 3);
    assert_eq!(pids(&procs), [2, 1], "cc1 before python3");
    sort_procs(&mut procs, 1);
    assert_eq!(pids(&procs), [1, 2]);
}

#[test]
fn keys() {
    let key = |code| KeyEvent::new(code, KeyModifiers::NONE);
    assert_eq!(view::action(&key(KeyCode::Char('q'))), Action::Quit);
    assert_eq!(
        view::action(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Action::Quit
    );
    assert_eq!(
        view::action(&KeyEvent::new(KeyCode::Char('v'), KeyModifiers::CONTROL)),
        Action::Nothing
    );
    assert_eq!(view::action(&key(KeyCode::Tab)), Action::SwitchView);
    assert_eq!(view::action(&key(KeyCode::Char('v'))), Action::SwitchView);
    assert_eq!(view::action(&key(KeyCode::Char('3'))), Action::Sort(2));
    assert_eq!(view::action(&key(KeyCode::Char('5'))), Action::Nothing);
    assert_eq!(view::action(&key(KeyCode::Char('s'))), Action::NextSort);
    assert_eq!(view::action(&key(KeyCode::Char(' '))), Action::Pause);
    assert_eq!(view::action(&key(KeyCode::Char('r'))), Action::Reset);

    let mut ui = Ui::new("all processes".into());
    assert!(ui.apply(Action::Sort(1)));
    assert_eq!((ui.func_sort, ui.proc_sort), (1, 0));
    assert!(ui.apply(Action::SwitchView));
    assert_eq!(ui.view, View::Processes);
    assert!(ui.apply(Action::NextSort));
    assert!(ui.apply(Action::NextSort));
    assert_eq!((ui.func_sort, ui.proc_sort), (1, 2));
    assert!(ui.apply(Action::Pause));
    assert!(ui.paused);
    assert!(!ui.apply(Action::Nothing));
}

#[test]
fn fits_width_and_height() {
    let mut p = profile(100);
    scene(&mut p);
    let long = Frame {
        file: Some(format!("/srv/{}handlers.py", "deep/".repeat(30)).into()),
        ..py("handle_request", 77)
    };
    add(&mut p, 1, "python3", &[py("main", 1), long], 4);
    let mut agg = Aggregator::default();
    let s = window(&mut agg, &mut p, SEC, SEC);
    let mut ui = Ui::new("pid 1".into());

    let wide = render(&s, &ui, 200, 50);
    assert_eq!(wide[3].style, Style::Reverse);
    assert!(wide[3].text.contains("%Own") && wide[3].text.contains("TotalTime"));
    // Sorted by %Own: the long-named function (4 samples) first, its location shortened.
    let first = &wide[4].text;
    assert!(
        first.contains("handle_request (...") && first.ends_with("deep/handlers.py:77)"),
        "{first}"
    );
    assert!(width_of(first) <= 200);
    assert!(wide[0].text.contains("pid 1") && wide[0].text.contains("Python processes: 1"));

    for (w, h) in [(40, 6), (10, 3), (1, 1), (0, 0)] {
        for view in [View::Functions, View::Processes] {
            ui.view = view;
            let lines = render(&s, &ui, w, h);
            assert!(lines.len() <= usize::from(h), "{w}x{h}: {lines:?}");
            for l in &lines {
                assert!(width_of(&l.text) <= usize::from(w), "{w}x{h}: {l:?}");
            }
        }
    }
    ui.view = View::Functions;
    assert_eq!(render(&s, &ui, 80, 6).len(), 6, "4 header lines + 2 rows");

    ui.view = View::Processes;
    let procs = render(&s, &ui, 160, 40);
    let line = procs
        .iter()
        .find(|l| l.text.trim_start().starts_with("1 "))
        .unwrap();
    assert!(line.text.contains("python3"), "{line:?}");
    assert!(line.text.contains("handle_request ("), "{line:?}");
    assert!(
        line.text.contains("9.0%"),
        "9 samples in 1 s at 100 Hz: {line:?}"
    );
}

#[test]
fn labels_and_cells() {
    // Untrusted names never carry control characters to the terminal.
    let f = Frame::new(FrameKind::Native, "evil\x1b[2Jname");
    assert_eq!(&*Label::of(&f).name, "evil?[2Jname");
    assert_eq!(clean("a\nb\tc"), "a?b?c");
    let k = Label::of(&Frame::new(FrameKind::Kernel, "do_sys_poll"));
    assert_eq!(k.text(), "do_sys_poll (kernel)");
    // Wide characters take two cells and are never split.
    assert_eq!(width_of("a漢b"), 4);
    assert_eq!(truncate("a漢b", 2), "a");
    assert_eq!(truncate("abc", 5), "abc");
    let l = Label {
        name: "f".into(),
        location: "/a/very/long/path/to/module.py:12".into(),
    };
    assert_eq!(fit_label(&l, 100), "f (/a/very/long/path/to/module.py:12)");
    assert_eq!(fit_label(&l, 24), "f (...h/to/module.py:12)");
    assert_eq!(fit_label(&l, 5), "f (/a");
}

#[test]
fn before_the_first_window() {
    let ui = Ui::new("all processes".into());
    let lines = render(&Snapshot::default(), &ui, 80, 24);
    assert_eq!(lines.last().unwrap().text, "(collecting samples...)");
}

/// `top --idle`: weighted samples count by weight, the state frame is no row (its function
/// is), and the State column says where each function's own time went.
#[test]
fn idle_rows_count_weights_and_show_states() {
    use crate::profile::ThreadState;
    let mut p = Profile::new(RunMeta {
        rate_hz: 100,
        cpus: 2,
        idle: true,
        ..RunMeta::default()
    });
    let root = p.intern_frame(Frame::new(FrameKind::Process, "python3 (1)"));
    let main = p.intern_frame(py("main", 1));
    let nap = p.intern_frame(py("nap", 2));
    let state = p.intern_frame(Frame::new(
        FrameKind::State,
        "[off-CPU: sleeping in clock_nanosleep]",
    ));
    let asleep = p.intern_stack(&[root, main, nap, state]);
    let running = p.intern_stack(&[root, main, nap]);
    for (stack, st, weight) in [
        (asleep, ThreadState::Sleeping, 6),
        (running, ThreadState::OnCpu, 1),
        (running, ThreadState::OnCpu, 1),
    ] {
        p.add_sample(NamedSample {
            stack,
            time_ns: 0,
            pid: 1,
            tid: 1,
            cpu: 0,
            comm: "python3".into(),
            thread_name: "python3".into(),
            gil: GilState::Unknown,
            state: st,
            weight,
        });
    }
    let mut agg = Aggregator::default();
    let s = window(&mut agg, &mut p, SEC, SEC);
    assert!(s.idle);
    assert_eq!(s.samples, 8);
    let r = row(&s, "nap").expect("nap row");
    assert_eq!((r.own, r.total), (8, 8));
    assert_eq!(r.main_state(), Some((ThreadState::Sleeping, 75.0)));
    assert!(
        s.funcs.iter().all(|r| !r.label.name.contains("off-CPU")),
        "{:?}",
        s.funcs
    );
    let ui = Ui::new("pid 1 +idle".into());
    let screen = render(&s, &ui, 120, 20);
    let text: Vec<&str> = screen.iter().map(|l| l.text.as_str()).collect();
    assert!(text[3].contains("State"), "{text:?}");
    assert!(
        text.iter()
            .any(|l| l.contains("sleeping 75%") && l.contains("nap")),
        "{text:?}"
    );
}
