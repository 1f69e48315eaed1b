//! Deliverable 4, `record -- command args`: a Python command started by `record` (plainly, and
//! through `chroot` into the sid root, where the interpreter is exec'd by another program) is
//! profiled with named Python frames from its first second on, and the run stops when it exits.

use super::support::{Installed, OutDir, count_where, is_py_frame, record, setup, show, total};

/// CPU seconds the command burns in `burn`.
const BURN_S: &str = "1.0";

fn python_command(name: &str) {
    let Some(interp) = setup(name) else { return };
    let files = Installed::new(&interp, "rec_short.py");
    let dir = OutDir::new(&format!("cmd-{name}"));
    let mut args = vec!["-f", "collapsed", "--"];
    let root;
    if let Some(r) = &interp.root {
        root = r.to_str().unwrap().to_string();
        args.extend(["chroot", root.as_str()]);
    }
    args.extend([interp.python.as_str(), files.script.as_str(), BURN_S]);
    let rec = record(&args, &dir.join("cmd.txt"), &[]);
    let comm = std::path::Path::new(&interp.python)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    // comm is at most 15 bytes.
    let comm: String = comm.chars().take(15).collect();
    let mine: Vec<_> = rec
        .samples
        .iter()
        .filter(|s| s.frames[0].starts_with(&format!("{comm} (")))
        .collect();
    let n = total(&mine);
    let burn_stack = [
        files.label("<module>", "call_main"),
        files.label("main", "call_burn"),
        files.label("burn", "burn"),
    ];
    let burning = count_where(&mine, |s| s.frames[1..] == burn_stack);
    let with_py = count_where(&mine, |s| s.frames.iter().any(|f| is_py_frame(f)));
    eprintln!("record -- {name}: {n} samples, {with_py} with Python frames, {burning} in burn");
    assert!(
        n >= 20 && burning * 100 >= n * 80,
        "record -- {name} {} {BURN_S}: want ≥ 20 samples under `{comm} (pid)` and ≥ 80 % of them \
         exactly <module> → main → burn; got {burning} of {n} ({with_py} with any Python frame) \
         ({})\nexpected, outermost first: {burn_stack:?}\nsamples:\n{}stderr:\n{}",
        files.script,
        rec.what,
        show(&mine, 15),
        rec.stderr
    );
}

#[test]
fn command_python_3_12() {
    python_command("3.12");
}

#[test]
fn command_python_3_14_via_chroot() {
    python_command("3.14");
}

/// Issue 10: a 3.8 command (its version is read from `.bss`, where `Py_GetVersion()` writes it
/// during start-up) and Debian 11's 3.9 exec'd by `chroot` into the bullseye root.
#[test]
fn command_python_3_8() {
    python_command("3.8");
}

#[test]
fn command_python_3_9_bullseye_via_chroot() {
    python_command("3.9-bullseye");
}
