"""Shared readiness protocol of the `pyebpf dump` end-to-end workloads.

The test copies this module next to each workload script. A workload starts its threads, calls
`wait_until_at` until every thread sits on its spinning line (as CPython itself reports it through
`sys._current_frames()`), then `write_ready` records, for every thread, its ids and CPython's own
view of its stack, and `linger` keeps the process alive until the test kills it.

Lines tagged `# LINE:<tag>` are found by `markers` here and by the Rust test in the same way.
"""

import json
import os
import sys
import threading
import time

# A workload never outlives its test by much, even if the test process dies without killing it.
MAX_LIFETIME_S = 900

# The kernel writes a core file into the crashing process's working directory (core_pattern
# "core"): a test that wants one there asks for the script's own directory.
if os.environ.get("PYEBPF_CHDIR_TO_SCRIPT"):
    os.chdir(os.path.dirname(os.path.abspath(sys.argv[0])))
READY_TIMEOUT_S = 300


def markers(path):
    """{tag: line} for every `# LINE:<tag>` comment of a file (1-based lines)."""
    found = {}
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if "# LINE:" in text:
                found[text.split("# LINE:", 1)[1].split()[0]] = number
    return found


def stack_of(ident):
    """CPython's own view of a thread's stack, innermost first (the `dump --json` frame shape)."""
    frame = sys._current_frames().get(ident)
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append(
            {
                # co_qualname exists from 3.11; before, pyebpf shows the plain co_name too.
                "function": getattr(code, "co_qualname", code.co_name),
                "file": code.co_filename,
                "line": frame.f_lineno,
                "first_line": code.co_firstlineno,
            }
        )
        frame = frame.f_back
    return frames


def wait_until_at(where):
    """Waits until every thread of `where` ({Thread: (code object, line)}) is in that code object
    at that line in its innermost frame."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        frames = sys._current_frames()
        pending = []
        for thread, (code, line) in where.items():
            frame = frames.get(thread.ident)
            if frame is None or frame.f_code is not code or frame.f_lineno != line:
                pending.append(thread.name)
        if not pending:
            return
        if time.monotonic() > deadline:
            sys.exit(f"workload: threads {pending} never reached their spinning lines")
        time.sleep(0.01)


def write_ready(path, threads, extra=None):
    """Atomically writes the ready file: pid, interpreter facts, and per thread (by name) its
    native id, Python id and CPython's own view of its stack."""
    data = {
        "pid": os.getpid(),
        "version": "%d.%d.%d" % sys.version_info[:3],
        "gil_enabled": sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True,
        "threads": {
            t.name: {"native_id": t.native_id, "ident": t.ident, "stack": stack_of(t.ident)}
            for t in threads
        },
    }
    data.update(extra or {})
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    os.rename(tmp, path)


def linger():
    """Keeps the process alive (the main thread sleeping, GIL released) until the test kills it,
    its parent goes away, or MAX_LIFETIME_S passes."""
    parent = os.getppid()
    deadline = time.monotonic() + MAX_LIFETIME_S
    while time.monotonic() < deadline:
        time.sleep(1)
        if parent > 1 and os.getppid() != parent:
            break
    os._exit(0)


def start(thread):
    """Starts a daemon thread and waits until it has an ident and a native id."""
    thread.daemon = True
    thread.start()
    while thread.ident is None or thread.native_id is None:
        time.sleep(0.001)
    return thread
