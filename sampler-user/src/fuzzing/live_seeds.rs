//! Seeds from real interpreters' memory (root): every interpreter of the test manifest runs a
//! workload whose threads sleep six frames deep with locals of every kind; its snapshot
//! (the pages the reader touched, [`Snapshot::record`]) must read back exactly what was read
//! live, and a core built from the same pages and the process's real mappings (`NT_FILE`, so
//! the interpreter's own file is found under `/`) must `dump` the same stacks. Both become
//! seeds (`python_reader/live-NAME`, `core/live-NAME`). A missing interpreter is SKIPPED (a
//! failure under `CI=true`).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::seeds::emit;
use crate::coredump::testcore::CoreBuilder;
use crate::python::live_tests::interp;
use crate::python::snapshot::Snapshot;
use crate::python::values::ValueLimits;
use crate::python::walker::Limits;

/// Runs on 3.8+: two threads and the main thread asleep six frames deep, with locals.
const WORKLOAD: &str = r#"
import os, sys, threading, time
def deep(n, name):
    values = [1, -2**70, 2.5, "é🐍", b"\x00\xff", (n, None, True), {"k": [n]}, {1, 2}]
    if n == 0:
        time.sleep(1e6)
    else:
        deep(n - 1, name)
for i in range(2):
    threading.Thread(target=deep, args=(5, "t%d" % i), name="worker-%d" % i, daemon=True).start()
def main():
    time.sleep(0.5)
    open(sys.argv[1] + ".tmp", "w").close()
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    deep(5, "main")
main()
"#;

struct Running {
    child: Child,
    host_dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.host_dir);
    }
}

fn start(name: &'static str) -> Option<Running> {
    let i = interp(name)?;
    let inner = format!("/tmp/pyebpf-seed-{}-{name}", std::process::id());
    let host_dir = i.root.as_ref().map_or_else(
        || PathBuf::from(&inner),
        |r| r.join(inner.trim_start_matches('/')),
    );
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::write(host_dir.join("w.py"), WORKLOAD).unwrap();
    let child = i
        .command()
        .args([format!("{inner}/w.py"), format!("{inner}/ready")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut run = Running { child, host_dir };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !run.host_dir.join("ready").exists() {
        assert!(
            Instant::now() < deadline,
            "{name}: the workload did not get ready"
        );
        if let Ok(Some(st)) = run.child.try_wait() {
            panic!("{name}: the workload exited: {st}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The main thread goes from writing the file to its sleep.
    std::thread::sleep(Duration::from_millis(200));
    Some(run)
}

/// A core of `pid` holding only the pages of `snapshot`'s bytes, its threads and its file mappings.
fn trimmed_core(pid: u32, snapshot: &Snapshot, threads: &[crate::python::PyThread]) -> Vec<u8> {
    let mut core = CoreBuilder::default();
    core.process(pid, "python");
    for t in threads {
        let tid = u32::try_from(t.native_thread_id).unwrap_or(0);
        core.thread(tid, 0, 0, 0, t.python_thread_id);
    }
    let maps = crate::procs::read_mappings(pid).unwrap();
    let paths: Vec<(u64, u64, u64, String)> = maps
        .iter()
        .filter(|m| m.is_file_backed())
        .map(|m| {
            let path = m.path.as_ref().unwrap().to_string_lossy().into_owned();
            (m.start, m.end, m.file_offset / 4096, path)
        })
        .collect();
    let entries: Vec<(u64, u64, u64, &str)> = paths
        .iter()
        .map(|(s, e, o, p)| (*s, *e, *o, p.as_str()))
        .collect();
    core.files(&entries);
    // Whole pages, as the kernel writes them (the core's reader reads by page); bytes the
    // reader never asked for are zero.
    let mut pages: std::collections::BTreeMap<u64, Vec<u8>> = std::collections::BTreeMap::new();
    for (addr, bytes) in &snapshot.regions {
        for (i, b) in bytes.iter().enumerate() {
            let a = addr + i as u64;
            pages.entry(a & !4095).or_insert_with(|| vec![0; 4096])[(a & 4095) as usize] = *b;
        }
    }
    let mut run: Option<(u64, Vec<u8>)> = None;
    for (page, bytes) in pages {
        match &mut run {
            Some((start, data)) if *start + data.len() as u64 == page => data.extend(bytes),
            _ => {
                if let Some((start, data)) = run.replace((page, bytes)) {
                    core.load(start, data);
                }
            }
        }
    }
    if let Some((start, data)) = run {
        core.load(start, data);
    }
    core.bytes()
}

fn seeds_of(name: &'static str) {
    if !crate::procs::tests::require_root(&format!("live_seeds {name}")) {
        return;
    }
    let Some(run) = start(name) else { return };
    let pid = run.child.id();
    let limits = Limits {
        locals: Some(ValueLimits::default()),
        ..Limits::default()
    };
    let frames = |ts: &[crate::python::PyThread]| -> Vec<_> {
        ts.iter()
            .map(|t| (t.native_thread_id, t.frames.clone(), t.locals.clone()))
            .collect()
    };
    // A live attach first fills the per-file caches (as another test may have): the snapshot
    // must record what it reads all the same (3.8-3.10's `.bss` version was once taken from
    // the cache, so the snapshot lacked it and could not be attached).
    crate::python::PythonProcess::attach(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (snapshot, live) = Snapshot::record(pid, limits).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(live.len(), 3, "{name}: three threads");
    assert!(
        live.iter()
            .all(|t| t.frames.len() >= 6 && !t.locals[0].is_empty()),
        "{name}: every thread six frames deep with locals"
    );
    let bytes = snapshot.encode();
    let mut again = Snapshot::decode(&bytes)
        .unwrap()
        .attach()
        .unwrap_or_else(|e| panic!("{name}: attach to the snapshot: {e}"));
    again.set_limits(limits);
    assert_eq!(frames(&again.threads().unwrap()), frames(&live), "{name}");
    let mut seed = vec![2u8];
    seed.extend(&bytes);
    emit("python_reader", &format!("live-{name}"), &seed);

    let core = trimmed_core(pid, &snapshot, &live);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("core");
    std::fs::write(&path, &core).unwrap();
    let mut out = Vec::new();
    crate::dump::run(
        &crate::dump::DumpOptions {
            target: crate::dump::DumpTarget::Core {
                path,
                root: "/".into(),
            },
            json: true,
            locals: Some(ValueLimits::default()),
            native: false,
            pause: false,
        },
        &mut out,
    )
    .unwrap_or_else(|e| panic!("{name}: dump of the trimmed core: {e}"));
    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let dumped = json["threads"].as_array().unwrap();
    assert_eq!(dumped.len(), 3, "{name}: {json}");
    for (d, t) in dumped.iter().zip(&live) {
        let functions: Vec<&str> = d["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap())
            .collect();
        let want: Vec<&str> = t.frames.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(functions, want, "{name}");
    }
    emit("core", &format!("live-{name}"), &core);
}

#[test]
fn live_seeds_38() {
    seeds_of("3.8");
}

#[test]
fn live_seeds_310() {
    seeds_of("3.10");
}

#[test]
fn live_seeds_311() {
    seeds_of("3.11");
}

#[test]
fn live_seeds_312() {
    seeds_of("3.12");
}

#[test]
fn live_seeds_313t() {
    seeds_of("3.13t");
}

#[test]
fn live_seeds_314() {
    seeds_of("3.14");
}
