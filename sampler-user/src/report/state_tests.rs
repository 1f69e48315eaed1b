//! Wall-clock profiles (`record --idle`, issue 13) in `report` and the outputs: weighted
//! samples, the `state` and `gil` keys, the `--state` filter, state frames that never become a
//! row, and the saved format 3 round trip. Numbers worked out by hand in the comments.

use serde_json::Value;

use super::{ReportConfig, ReportOptions, render};
use crate::profile::{Frame, FrameKind, GilState, NamedSample, Profile, RunMeta, ThreadState};

/// Adds one sample of `tid` (pid 10, `app`) with `frames` (Python `name (/a.py:1)`, then the
/// state frame `state_frame` if any), `state`, `gil` and `weight`.
fn add(
    p: &mut Profile,
    tid: u32,
    frames: &[&str],
    state_frame: Option<&str>,
    (state, gil, weight): (ThreadState, GilState, u32),
) {
    let mut ids = vec![p.intern_frame(Frame::new(FrameKind::Process, "app (10)"))];
    for name in frames {
        let mut f = Frame::new(FrameKind::Python, *name);
        f.file = Some("/a.py".into());
        f.line = Some(1);
        ids.push(p.intern_frame(f));
    }
    if let Some(s) = state_frame {
        ids.push(p.intern_frame(Frame::new(FrameKind::State, s)));
    }
    let stack = p.intern_stack(&ids);
    p.add_sample(NamedSample {
        stack,
        time_ns: p.sample_count(),
        pid: 10,
        tid,
        cpu: 0,
        comm: "app".into(),
        thread_name: format!("t{tid}").into(),
        gil,
        state,
        weight,
    });
}

/// tid 11: on a CPU in `main;spin` 4 × 1, asleep in `main;nap` one interval of 6;
/// tid 12: `main;crunch` on a CPU 2 × 1 holding the GIL, waiting for the GIL in it one interval
/// of 3. Total weight 15: on-cpu 6, sleeping 6, gil-wait 3.
fn wall_profile() -> Profile {
    let mut p = Profile::new(RunMeta {
        rate_hz: 100,
        idle: true,
        ..RunMeta::default()
    });
    p.keep_timeline();
    let on = (ThreadState::OnCpu, GilState::Held, 1);
    for _ in 0..4 {
        add(&mut p, 11, &["main", "spin"], None, on);
    }
    add(
        &mut p,
        11,
        &["main", "nap"],
        Some("[off-CPU: sleeping in clock_nanosleep]"),
        (ThreadState::Sleeping, GilState::Released, 6),
    );
    for _ in 0..2 {
        add(&mut p, 12, &["main", "crunch"], None, on);
    }
    add(
        &mut p,
        12,
        &["main", "crunch"],
        Some("[off-CPU: GIL wait]"),
        (ThreadState::GilWait, GilState::Released, 3),
    );
    p
}

fn opts(sort: &str) -> ReportOptions {
    ReportOptions {
        sort: sort.split(',').map(str::to_string).collect(),
        json: true,
        ..ReportOptions::default()
    }
}

/// (keys joined by `|`, self, children (0 without `--children`)) of every JSON row, and the
/// total.
fn table(p: &Profile, o: &ReportOptions) -> (Vec<(String, u64, u64)>, u64) {
    let mut out = Vec::new();
    render(p, &ReportConfig::new(o).unwrap(), &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    let keys = o.sort.clone();
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let k: Vec<String> = keys
                .iter()
                .map(|k| match &r["keys"][k] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            (
                k.join("|"),
                r["samples"].as_u64().unwrap(),
                r["children"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    (rows, v["total"].as_u64().unwrap())
}

fn text(p: &Profile, o: &ReportOptions) -> String {
    let o = ReportOptions {
        json: false,
        ..o.clone()
    };
    let mut out = Vec::new();
    render(p, &ReportConfig::new(&o).unwrap(), &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn sort_state_counts_weights_and_sums_to_the_total() {
    let p = wall_profile();
    let (rows, total) = table(&p, &opts("state"));
    assert_eq!(total, 15);
    assert_eq!(
        rows,
        vec![
            ("on-cpu".to_string(), 6, 0),
            ("sleeping".to_string(), 6, 0),
            ("gil-wait".to_string(), 3, 0),
        ]
    );
    assert_eq!(rows.iter().map(|r| r.1).sum::<u64>(), total);
    let t = text(&p, &opts("state"));
    assert!(t.contains("# samples: 15\n"), "{t}");
    assert!(t.contains("wall clock (--idle)"), "{t}");
    assert!(t.contains("40.00%"), "{t}");
}

#[test]
fn state_frames_are_never_rows() {
    let p = wall_profile();
    // Self: the leaf is the innermost Python frame, not the state.
    let (rows, _) = table(&p, &opts("function"));
    assert_eq!(
        rows,
        vec![
            ("[.] nap".to_string(), 6, 0),
            ("[.] crunch".to_string(), 5, 0),
            ("[.] spin".to_string(), 4, 0),
        ]
    );
    let mut o = opts("function");
    o.children = true;
    let (rows, _) = table(&p, &o);
    assert!(rows.iter().all(|r| !r.0.contains("off-CPU")), "{rows:?}");
    assert!(rows.contains(&("[.] main".to_string(), 0, 15)), "{rows:?}");
}

#[test]
fn gil_wait_per_function() {
    let p = wall_profile();
    let mut o = opts("state,function");
    o.states = vec!["gil-wait".into()];
    let (rows, total) = table(&p, &o);
    assert_eq!(total, 3);
    assert_eq!(rows, vec![("gil-wait|[.] crunch".to_string(), 3, 0)]);
    let t = text(&p, &o);
    assert!(t.contains("# filters: --state gil-wait"), "{t}");
    // Several states, and the GIL key.
    o.states = vec!["on-cpu".into(), "sleeping".into()];
    o.sort = vec!["gil".into()];
    let (rows, total) = table(&p, &o);
    assert_eq!(total, 12);
    assert_eq!(
        rows,
        vec![("held".to_string(), 6, 0), ("released".to_string(), 6, 0)]
    );
}

#[test]
fn outputs_count_weights_and_show_the_state_frame() {
    let p = wall_profile();
    assert_eq!(p.total_weight(), 15);
    let folded = p.folded_lines();
    assert!(
        folded.contains(
            &"app (10);main (/a.py:1);nap (/a.py:1);[off-CPU: sleeping in clock_nanosleep] 6"
                .to_string()
        ),
        "{folded:?}"
    );
    let sum: u64 = folded
        .iter()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, 15);
    // The flame graph shows the state as the top frame of its stack.
    let mut svg = Vec::new();
    crate::output::Format::Flamegraph
        .render(&p, &mut svg)
        .unwrap();
    let svg = String::from_utf8(svg).unwrap();
    assert!(
        svg.contains("[off-CPU: GIL wait]"),
        "state frame in the SVG"
    );
    assert!(svg.contains("15 samples"), "weighted total in the subtitle");
}

#[test]
fn saved_wall_clock_runs_are_version_3_and_round_trip() {
    let p = wall_profile();
    let mut bytes = Vec::new();
    crate::saved::writer::write_profile(&p, &mut bytes).unwrap();
    assert_eq!(&bytes[8..12], &3u32.to_le_bytes(), "format version 3");
    let back = crate::saved::load_from_with(&bytes[..], true)
        .unwrap()
        .profile;
    assert_eq!(back.timeline(), p.timeline());
    assert_eq!(back.counts(), p.counts());
    assert_eq!(back.frames(), p.frames());
    assert!(back.meta.idle);
    assert_eq!(back.total_weight(), 15);
    for sort in ["state", "state,function", "function"] {
        assert_eq!(text(&back, &opts(sort)), text(&p, &opts(sort)), "{sort}");
    }
    // A plain run stays version 2 (older readers keep reading it).
    let mut plain = Profile::new(RunMeta::default());
    plain.keep_timeline();
    add(
        &mut plain,
        1,
        &["f"],
        None,
        (ThreadState::OnCpu, GilState::Unknown, 1),
    );
    let mut bytes = Vec::new();
    crate::saved::writer::write_profile(&plain, &mut bytes).unwrap();
    assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
    // A weighted sample cannot be written into a plain (version 2) file.
    let mut bad = Profile::new(RunMeta::default());
    bad.keep_timeline();
    add(
        &mut bad,
        1,
        &["f"],
        Some("[off-CPU: runnable]"),
        (ThreadState::Runnable, GilState::Unknown, 2),
    );
    assert!(crate::saved::writer::write_profile(&bad, &mut Vec::new()).is_err());
}

#[test]
fn pprof_counts_weights_as_wall_time_with_a_state_label() {
    let p = wall_profile();
    let mut bytes = Vec::new();
    crate::output::Format::Pprof.render(&p, &mut bytes).unwrap();
    let prof = crate::output::pprof::decode(&bytes).unwrap();
    let s = |i: i64| prof.string_table[i as usize].as_str();
    assert_eq!(prof.sample.iter().map(|x| x.value[0]).sum::<i64>(), 15);
    assert_eq!(s(prof.sample_type[1].r#type), "wall");
    let mut states: Vec<&str> = prof
        .sample
        .iter()
        .flat_map(|x| x.label.iter())
        .filter(|l| s(l.key) == "state")
        .map(|l| s(l.str))
        .collect();
    states.sort_unstable();
    states.dedup();
    assert_eq!(states, ["gil-wait", "on-cpu", "sleeping"]);
}
