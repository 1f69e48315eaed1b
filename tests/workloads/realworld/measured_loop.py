"""The protocol of the real-world workloads (`*_loop.py`), shared: `run(work)` is their main.

Usage of a workload: python NAME_loop.py READY_FILE [SECONDS]

Whoever runs a workload copies this module next to it (`cargo xtask bench`, the e2e tests).
Before the loop, two calls of `work` run under `sys.setprofile` to measure the deepest Python
stack the program reaches (frames from `<module>` to the innermost, as a profiler shows them);
the ready file (JSON: `pid`, `max_depth`, `version`) is written after that, then `work` runs in
a loop until SECONDS have passed (default: until killed).
"""

import json
import os
import sys
import time


def depth_of(frame):
    n = 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


def deepest(work, iterations):
    """The deepest Python stack reached while running `work` `iterations` times."""
    state = {"depth": depth_of(sys._getframe()), "max": 0}

    def profile(frame, event, arg):
        if event == "call":
            state["depth"] += 1
            state["max"] = max(state["max"], state["depth"])
        elif event == "return":
            state["depth"] -= 1

    sys.setprofile(profile)
    try:
        for _ in range(iterations):
            work()
    finally:
        sys.setprofile(None)
    return state["max"]


def run(work):
    ready = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else None
    # `deepest` adds its own frame under `work`; the loop below calls `work` from `run`, one
    # frame less deep.
    max_depth = deepest(work, 2) - 1
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "max_depth": max_depth,
                "version": "%d.%d.%d" % sys.version_info[:3],
            },
            f,
        )
    os.rename(tmp, ready)
    deadline = None if seconds is None else time.monotonic() + seconds
    while deadline is None or time.monotonic() < deadline:
        work()
