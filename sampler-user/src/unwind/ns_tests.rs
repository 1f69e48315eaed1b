//! End-to-end tests for targets that do not share our view of the system: a chrooted static
//! (non-PIE, load bias 0) executable, and a process in its own PID and mount namespaces.

use std::path::Path;
use std::process::{Command, Stdio};

use super::test_target::{Running, TARGET_C, TempDir, compile, snapshot};
use super::*;
use crate::procs::tests::require_root;
use crate::symbolize::Symbolizer;

fn unwind_names(reg: &mut ProcessRegistry, pid: u32) -> (NativeStack, Vec<String>) {
    let mut unwinder = NativeUnwinder::new();
    let mut sym = Symbolizer::new();
    let snap = snapshot(pid, 32 << 10);
    let stack = unwinder.unwind(reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
    let proc = reg.get(pid).expect("process");
    let names = stack
        .frames
        .iter()
        .map(|f| sym.native(proc, f.lookup_address()).name.clone())
        .collect();
    (stack, names)
}

fn assert_hot_to_main(names: &[String]) {
    let want = ["hot", "middle", "outer", "main"];
    assert_eq!(&names[..4.min(names.len())], &want[..], "{names:?}");
}

/// Wait for `ready` on the child's stdout.
fn wait_ready(r: &mut Running) {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(r.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    std::thread::sleep(std::time::Duration::from_millis(50));
}

#[test]
fn chrooted_static_executable() {
    if !require_root("chrooted_static_executable") {
        return;
    }
    let dir = TempDir::new("unwind-chroot");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    compile(&root, "target", TARGET_C, &["-static"]);
    let child = Command::new("chroot")
        .arg(&root)
        .arg("/target")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut target = Running(child);
    wait_ready(&mut target);
    let pid = target.pid(); // chroot execs the target: same pid
    let mut reg = ProcessRegistry::new();
    let proc = reg.get_or_load(pid).unwrap();
    // The maps show host paths for a chrooted process.
    let text = proc
        .mappings
        .iter()
        .find(|m| m.perms.exec && m.is_file_backed())
        .expect("text mapping");
    assert_eq!(text.clean_path(), Some(root.join("target").as_path()));
    let (stack, names) = unwind_names(&mut reg, pid);
    assert_hot_to_main(&names);
    assert!(!stack.truncated, "{:?} {names:?}", stack.error);
    assert_eq!(
        names.last().map(String::as_str),
        Some("_start"),
        "{names:?}"
    );
}

#[test]
fn process_in_its_own_pid_and_mount_namespaces() {
    if !require_root("process_in_its_own_pid_and_mount_namespaces") {
        return;
    }
    let dir = TempDir::new("unwind-pidns");
    let exe = compile(&dir.0, "target", TARGET_C, &[]);
    let child = Command::new("unshare")
        .args(["--pid", "--mount", "--kill-child"])
        .arg(&exe)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut unshare = Running(child);
    wait_ready(&mut unshare);
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.pid())).unwrap();
    let pid: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    let mut reg = ProcessRegistry::new();
    let proc = reg.get_or_load(pid).unwrap();
    assert_eq!(proc.ns_pid, Some(1), "first process of a new PID namespace");
    assert_eq!(proc.thread_ns_tid(pid), Some(1));
    assert_eq!(proc.exe.as_deref(), Some(exe.as_path()));
    assert_eq!(
        proc.root,
        Path::new("/proc").join(pid.to_string()).join("root")
    );
    let (stack, names) = unwind_names(&mut reg, pid);
    assert_hot_to_main(&names);
    assert!(!stack.truncated, "{:?} {names:?}", stack.error);
}
