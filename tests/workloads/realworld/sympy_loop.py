"""Real-world workload: sympy 1.13.3 doing algebra in a loop (issue 17).

Usage: python sympy_loop.py READY_FILE [SECONDS]

The third-party packages are on PYTHONPATH (`cargo xtask setup --interpreters` installs them,
pinned, into one directory shared by every interpreter). Each iteration starts with sympy's
caches cleared, so every iteration runs the same code paths as the first. Before the loop, two
iterations run under `sys.setprofile` to measure the deepest Python stack the program reaches
(frames from `<module>` to the innermost, as a profiler shows them); the ready file (JSON:
`pid`, `max_depth`, `version`) is written after that, then the loop runs until SECONDS have
passed (default: until killed).
"""

import json
import os
import sys
import time

from sympy import cos, exp, expand, factor, integrate, series, simplify, sin, symbols
from sympy.core.cache import clear_cache

x, y, z = symbols("x y z")


def work():
    clear_cache()
    e = expand((x + y + z + 1) ** 6)
    factor(e)
    integrate(x**3 * sin(x) * exp(x), x)
    simplify(sin(x) ** 2 + cos(x) ** 2 + (x**2 - 1) / (x - 1))
    series(exp(sin(x)), x, 0, 6)


def depth_of(frame):
    n = 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


def deepest(iterations):
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


def main():
    ready = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else None
    # `deepest` adds its own frame under `work`; the loop below calls `work` from `main`, one
    # frame less deep.
    max_depth = deepest(2) - 1
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


if __name__ == "__main__":
    main()
