"""Workload: a thread 3000 Python calls deep (`pyebpf dump` e2e).

Usage: python deep_recursion.py READY_FILE [DEPTH]

Thread "deep" calls `rec(DEPTH)`, which recurses down to `rec(0)`, which calls `bottom()`, which
spins: DEPTH + 1 frames of `rec` (DEPTH at line `rec_call`, one at `rec_base`) under `bottom`.
"""

import sys
import threading

import harness

DEPTH = int(sys.argv[2]) if len(sys.argv) > 2 else 3000


def bottom():  # LINE:def_bottom
    x = 0
    while True: x += 1  # LINE:bottom_spin


def rec(n):  # LINE:def_rec
    if n == 0:
        return bottom()  # LINE:rec_base
    return rec(n - 1)  # LINE:rec_call


def main():
    sys.setrecursionlimit(DEPTH + 1000)
    lines = harness.markers(__file__)
    t = harness.start(threading.Thread(target=rec, args=(DEPTH,), name="deep"))
    harness.wait_until_at({t: (bottom.__code__, lines["bottom_spin"])})
    harness.write_ready(sys.argv[1], [t], {"depth": DEPTH})
    harness.linger()


if __name__ == "__main__":
    main()
