//! Issue 6 acceptance: `pyebpf top` under tmux, on the real kernel with a spinning CPython.
//!
//! Each test starts `tests/workloads/py/rec_spin.py` (its thread `spinner` spins in `spin` at
//! the line tagged `spin`), then `pyebpf top` in a detached tmux session 160 × 40 on a server of
//! its own (`tmux -L`, `remain-on-exit on`, so the exit status and `#{alternate_on}` are
//! readable after the exit), and reads the screen with `capture-pane`:
//!
//! - the busy function `spin (…/rec_spin.py:LINE)` shows within 3 s of the first drawn screen
//!   (`-p PID`, and host-wide without `-p`);
//! - the view key (Tab, `v`) shows the process view: the workload's pid with `spin` as its
//!   hottest Python function;
//! - `q`, Ctrl-C (a key in raw mode) and SIGTERM end it with status 0 and the alternate screen
//!   off (the terminal restored).
//!
//! - `--idle` (issue 13): a State column; the sleeping and blocked functions of
//!   `rec_idle.py` show as `sleeping`, the state frame is never a row.
//!
//! Without a terminal on stdout `top` fails with one line. The tmux server and the workload are
//! killed by drop guards whatever happens.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{missing, pyebpf, pyebpf_bin, run, text};
use crate::pyrecord::support::{Workload, setup, unique};

/// From the first drawn screen to the busy function on it (the acceptance bound).
const SHOW_WITHIN: Duration = Duration::from_secs(3);
/// From starting `top` to its first screen: loading and verifying the eBPF program takes
/// seconds for a debug build on a busy machine.
const FIRST_SCREEN_WITHIN: Duration = Duration::from_mins(2);
/// From a key to the screen or the exit it asks for.
const REACT_WITHIN: Duration = Duration::from_secs(10);

/// A tmux server of our own running one session; killed on drop.
struct Tmux {
    socket: String,
    session: String,
}

impl Tmux {
    /// Starts `command` (run by tmux's shell) in a detached 160 × 40 session with
    /// `remain-on-exit on`; `None` after [`missing`] when tmux is not installed.
    fn start(command: &str) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            missing("tmux is not installed (`cargo xtask setup` installs it)");
            return None;
        }
        let t = Tmux {
            socket: unique("pyebpf-top"),
            session: "top".to_string(),
        };
        // One client command: the option is set before the pane's command can exit.
        let o = t.tmux(&[
            "-f",
            "/dev/null",
            "start-server",
            ";",
            "set-option",
            "-g",
            "remain-on-exit",
            "on",
            ";",
            "new-session",
            "-d",
            "-s",
            &t.session,
            "-x",
            "160",
            "-y",
            "40",
            command,
        ]);
        assert!(o.status.success(), "tmux new-session: {}", text(&o.stderr));
        Some(t)
    }

    fn tmux(&self, args: &[&str]) -> Output {
        let mut c = Command::new("tmux");
        c.arg("-L")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null());
        run(&mut c)
    }

    /// The pane's text now.
    fn screen(&self) -> String {
        text(
            &self
                .tmux(&["capture-pane", "-p", "-t", &self.session])
                .stdout,
        )
    }

    /// A tmux format evaluated for the pane.
    fn format(&self, f: &str) -> String {
        let o = self.tmux(&["display-message", "-p", "-t", &self.session, f]);
        text(&o.stdout).trim().to_string()
    }

    fn send(&self, key: &str) {
        let o = self.tmux(&["send-keys", "-t", &self.session, key]);
        assert!(o.status.success(), "send-keys {key}: {}", text(&o.stderr));
    }

    /// Polls the screen until `ok` holds; returns it and when it was first seen, or panics with
    /// the last screen after `timeout`.
    #[track_caller]
    fn wait_screen(&self, what: &str, timeout: Duration, ok: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                self.format("#{pane_dead}") != "1",
                "top exited while waiting for {what}; screen:\n{s}"
            );
            assert!(
                t0.elapsed() < timeout,
                "no {what} after {timeout:?}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the pane's command has exited and tmux has its status; returns
    /// (exit status, `#{alternate_on}`).
    #[track_caller]
    fn wait_exit(&self, after: &str) -> (String, String) {
        let t0 = Instant::now();
        loop {
            let f = self.format("#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}|#{pid}");
            let parts: Vec<&str> = f.split('|').collect();
            if let [dead, status, signal, server] = parts[..] {
                if dead == "1" && !status.is_empty() {
                    return (status.to_string(), self.format("#{alternate_on}"));
                }
                assert!(
                    signal.is_empty(),
                    "top was killed by signal {signal} after {after}; screen:\n{}",
                    self.screen()
                );
                if dead == "1" {
                    // The pane is closed but tmux has not reaped the process: tmux can miss
                    // SIGCHLD (tmux/tmux#311, libutempter); ask it to look again.
                    if let Ok(pid) = server.parse::<i32>() {
                        // SAFETY: kill(2) with a valid signal number.
                        unsafe { libc::kill(pid, libc::SIGCHLD) };
                    }
                }
            }
            assert!(
                t0.elapsed() < REACT_WITHIN,
                "top still running {REACT_WITHIN:?} after {after} ({f}); screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

/// The shell command tmux runs: `exec pyebpf top ARGS` (exec: the pane's pid is `top`'s).
fn top_command(args: &[&str]) -> String {
    let mut c = format!("exec '{}' top", pyebpf_bin().display());
    for a in args {
        c.push(' ');
        c.push_str(a);
    }
    c
}

/// `top` in tmux on a spinning workload of `interp`, checked up to its process view. Returns
/// the tmux session, the workload and the first function-view screen with the busy function.
fn start_top(interp: &str, host_wide: bool) -> Option<(Tmux, Workload, String)> {
    let interp = setup(interp)?;
    let w = Workload::start(&interp, "rec_spin.py", &[], &[]);
    let pid = w.pid.to_string();
    let args: Vec<&str> = if host_wide {
        Vec::new()
    } else {
        vec!["-p", &pid]
    };
    let tmux = Tmux::start(&top_command(&args))?;
    tmux.wait_screen("first screen", FIRST_SCREEN_WITHIN, |s| {
        s.contains("pyebpf top - ")
    });
    let first = Instant::now();
    // `top` shows file names relative to their sys.path entry: the script's directory.
    let busy = format!("spin (rec_spin.py:{})", w.files.line("spin"));
    let screen = tmux.wait_screen(&format!("busy function {busy}"), SHOW_WITHIN, |s| {
        s.lines().any(|l| l.contains(&busy))
    });
    let took = first.elapsed();
    assert!(took <= SHOW_WITHIN, "{busy} took {took:?}");
    // Its row: own and total percentages, then the times, then the label.
    let row = screen.lines().find(|l| l.contains(&busy)).unwrap();
    assert!(
        row.split_whitespace()
            .next()
            .is_some_and(|p| p.ends_with('%')),
        "not a function row: {row}"
    );
    Some((tmux, w, screen))
}

/// Switches to the process view with `key` and checks the workload's row: its pid, its comm,
/// `spin` as its hottest Python function.
#[track_caller]
fn check_process_view(tmux: &Tmux, w: &Workload, key: &str) {
    tmux.send(key);
    let pid = w.pid.to_string();
    let hottest = "spin (rec_spin.py:";
    let screen = tmux.wait_screen("process view", REACT_WITHIN, |s| {
        s.contains("Processes sorted by")
            && s.lines()
                .any(|l| l.split_whitespace().next() == Some(pid.as_str()) && l.contains(hottest))
    });
    assert!(
        screen.contains("Hottest Python function"),
        "process view without its column titles:\n{screen}"
    );
}

/// `top` ended with status 0 and left the alternate screen.
#[track_caller]
fn check_clean_exit(tmux: &Tmux, after: &str) {
    let (status, alternate) = tmux.wait_exit(after);
    assert_eq!(
        status,
        "0",
        "exit status after {after}; screen:\n{}",
        tmux.screen()
    );
    assert_eq!(
        alternate,
        "0",
        "alternate screen still on after {after}: the terminal was not restored; screen:\n{}",
        tmux.screen()
    );
}

#[test]
fn top_pid_shows_busy_function_switches_view_and_quits_on_q() {
    let Some((tmux, w, screen)) = start_top("3.12", false) else {
        return;
    };
    assert!(
        screen.contains(&format!("pid {}", w.pid)),
        "header without the target:\n{screen}"
    );
    check_process_view(&tmux, &w, "Tab");
    // Back to the functions with `v`, then sort by total (key 2).
    tmux.send("v");
    tmux.send("2");
    tmux.wait_screen("function view sorted by %Total", REACT_WITHIN, |s| {
        s.contains("Functions sorted by %Total")
    });
    tmux.send("q");
    check_clean_exit(&tmux, "q");
}

#[test]
fn top_host_wide_shows_busy_function_and_exits_on_ctrl_c() {
    let Some((tmux, w, screen)) = start_top("3.13", true) else {
        return;
    };
    assert!(
        screen.contains("all processes"),
        "header without the mode:\n{screen}"
    );
    check_process_view(&tmux, &w, "v");
    tmux.send("C-c");
    check_clean_exit(&tmux, "Ctrl-C");
}

#[test]
fn top_restores_the_terminal_on_sigterm() {
    let Some((tmux, _w, _)) = start_top("3.12", false) else {
        return;
    };
    let pid: i32 = tmux.format("#{pane_pid}").parse().expect("pane_pid");
    // SAFETY: kill(2) on the pane's process (`exec`ed into `top`).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    check_clean_exit(&tmux, "SIGTERM");
}

#[test]
fn top_without_a_terminal_fails_with_one_line() {
    let o = run(&mut pyebpf(&["top"]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stderr),
        "pyebpf: top needs a terminal; use record\n"
    );
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}

/// Issue 13: `top --idle -p PID` on the wall-clock workload: a State column, the sleeping
/// function's row saying `sleeping`, the blocked one's too, the state frame never a row.
#[test]
fn top_idle_shows_the_state_column() {
    let Some(interp) = setup("3.12") else {
        return;
    };
    let w = Workload::start(&interp, "rec_idle.py", &[], &[]);
    let pid = w.pid.to_string();
    let Some(tmux) = Tmux::start(&top_command(&["--idle", "-p", &pid])) else {
        return;
    };
    // `top` shows short file names (relative to the script's directory).
    let sleep = w.short_label("sleep_part", "sleep");
    let blocked = w.short_label("blocked_wait", "blocked");
    let screen = tmux.wait_screen(
        "the sleeping and blocked functions",
        FIRST_SCREEN_WITHIN,
        |s| {
            s.lines()
                .any(|l| l.contains(&sleep) && l.contains("sleeping"))
                && s.lines()
                    .any(|l| l.contains(&blocked) && l.contains("sleeping"))
        },
    );
    assert!(
        screen.contains("State") && screen.contains("+idle"),
        "no State column or mode:\n{screen}"
    );
    assert!(
        !screen.contains("[off-CPU"),
        "a state frame as a row:\n{screen}"
    );
    tmux.send("q");
    check_clean_exit(&tmux, "q");
}

/// `top -p PID -r 499 -n --gil` on `rec_gil.py` (3.12): the header says 499 Hz; native frames
/// show (`start_thread`, libc's thread entry); the thread hashing in C with the GIL released
/// is not counted (its `hash_forever` row, if a sample caught it in the instants it holds the
/// GIL between two buffers, stays under 5 % %Total of the last second; without `--gil` it was
/// 55 %), while the thread holding the GIL (`spin`) is. Then `top -k` on a C program
/// looping on `read(2)`: kernel frames show as rows located in `kernel`.
#[test]
fn top_rate_native_gil_and_kernel_flags() {
    let Some(interp) = setup("3.12") else {
        return;
    };
    let w = Workload::start(&interp, "rec_gil.py", &[], &[]);
    let pid = w.pid.to_string();
    let Some(tmux) = Tmux::start(&top_command(&["-p", &pid, "-r", "499", "-n", "--gil"])) else {
        return;
    };
    let spin = w.short_label("spin", "spin");
    tmux.wait_screen("first screen", FIRST_SCREEN_WITHIN, |s| {
        s.contains("pyebpf top - ")
    });
    // Sorted by %Total: `spin` and the thread's entry (libc's `start_thread`, a native frame)
    // are under every sample of the GIL holder.
    tmux.send("2");
    let screen = tmux.wait_screen("spin and a native frame", FIRST_SCREEN_WITHIN, |s| {
        s.contains("Functions sorted by %Total")
            && s.lines()
                .any(|l| l.contains(&spin) || l.contains("spin (rec_gil.py:"))
            && s.contains("start_thread (")
    });
    assert!(
        screen.contains("(499 Hz x "),
        "-r 499 not in the header:\n{screen}"
    );
    // A few more redraws: the hashing thread (on a CPU most of the time, GIL released) is not
    // counted under --gil.
    let hash = "hash_forever (";
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        let s = tmux.screen();
        for row in s.lines().filter(|l| l.contains(hash)) {
            // %Total (with -n the thread's own time is in the hashing C function).
            let total: f64 = row
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.trim_end_matches('%').parse().ok())
                .unwrap_or(100.0);
            assert!(
                total < 5.0,
                "--gil counts the thread without the GIL: {row}\n{s}"
            );
        }
    }
    tmux.send("q");
    check_clean_exit(&tmux, "q");
    drop(tmux);

    let bin = crate::common::build_c("native/readloop.c", &[]);
    let reader = crate::common::spawn_until(
        Command::new(bin).stdout(Stdio::null()),
        Duration::from_secs(5),
        |_| true,
    );
    let pid = reader.pid().to_string();
    let Some(tmux) = Tmux::start(&top_command(&["-p", &pid, "-k"])) else {
        return;
    };
    let screen = tmux.wait_screen("kernel frames", FIRST_SCREEN_WITHIN, |s| {
        s.lines()
            .any(|l| l.contains("read") && l.contains("(kernel)"))
    });
    assert!(screen.contains("pyebpf top - "), "{screen}");
    tmux.send("q");
    check_clean_exit(&tmux, "q");
}
