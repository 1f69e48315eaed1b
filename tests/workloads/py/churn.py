"""Workload: a stable spinning thread beside constant churn — threads starting and exiting, stacks
growing and shrinking, code objects compiled and freed (`pyebpf dump` robustness e2e).

Usage: python churn.py READY_FILE

"stable" spins at line `stable_spin` under `stable_outer`; "churner" keeps starting short-lived
threads ("ephemeral") that recurse to a varying depth through freshly compiled functions and exit.
A dump taken at any moment must succeed and must show "stable" exactly.
"""

import sys
import threading

import harness


def stable_leaf():  # LINE:def_stable_leaf
    x = 0
    while True: x += 1  # LINE:stable_spin


def stable_outer():  # LINE:def_stable_outer
    return stable_leaf()  # LINE:stable_call_leaf


def ephemeral(n, depth):
    namespace = {}
    source = f"def fresh_{n}(d):\n    return fresh_{n}(d - 1) if d else sum(range(500000))\n"
    exec(compile(source, f"<fresh-{n}>", "exec"), namespace)
    namespace[f"fresh_{n}"](depth)


def churn():
    n = 0
    while True:
        batch = []
        for _ in range(4):
            n += 1
            t = threading.Thread(target=ephemeral, args=(n, n % 200), name=f"ephemeral-{n}")
            t.start()
            batch.append(t)
        for t in batch:
            t.join()


def main():
    lines = harness.markers(__file__)
    stable = harness.start(threading.Thread(target=stable_outer, name="stable"))
    churner = harness.start(threading.Thread(target=churn, name="churner"))
    harness.wait_until_at({stable: (stable_leaf.__code__, lines["stable_spin"])})
    harness.write_ready(sys.argv[1], [stable, churner])
    harness.linger()


if __name__ == "__main__":
    main()
