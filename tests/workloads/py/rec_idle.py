"""Workload: wall-clock profiling (`pyebpf record --idle`, issue 13).

Usage: python rec_idle.py READY_FILE [STATS_FILE]

Two "cycler" threads repeat: spin for 40 ms (`spin_part`, the line tagged `spin`), then sleep
for 60 ms (`sleep_part`, the line tagged `sleep`); each measures with `time.monotonic()` the wall
time it spent in each part, so the split it reports is the truth whatever the machine's load
(a late wake-up lengthens the sleep part, a preemption the spin part). A "blocked" thread waits
on a lock the main thread holds forever (`blocked_wait`, the line tagged `blocked`). The ready
file (see harness.py) is written once every thread sits in its function; from then on the
stats file holds, rewritten atomically every 50 ms, each cycler's cumulative spin and sleep
seconds and its last cycles as `[start, end of spin, end of sleep]` in `time.monotonic()`
seconds (CLOCK_MONOTONIC, the clock of pyebpf's sample times), so that a test can take the
truth of exactly its recording window.
"""

import collections
import json
import os
import sys
import threading
import time

import harness

SPIN_S = 0.040
SLEEP_S = 0.060
# The last cycles of each cycler (about 40 s of them).
CYCLES_KEPT = 400
TOTALS = {}
CYCLES = {}
LOCK = threading.Lock()


def spin_part(until):  # LINE:def_spin
    x = 0
    while time.monotonic() < until: x += 1  # LINE:spin
    return x


def sleep_part():  # LINE:def_sleep
    time.sleep(SLEEP_S)  # LINE:sleep


def cycle(name):  # LINE:def_cycle
    totals = TOTALS[name]
    cycles = CYCLES[name]
    while True:
        t0 = time.monotonic()
        spin_part(t0 + SPIN_S)
        t1 = time.monotonic()
        sleep_part()
        t2 = time.monotonic()
        totals[0] += t1 - t0
        totals[1] += t2 - t1
        cycles.append((t0, t1, t2))


def blocked_wait():  # LINE:def_blocked
    LOCK.acquire()  # LINE:blocked


def snapshot(cycles):
    """A list of a deque another thread appends to (free-threaded builds may raise while it
    grows: try again)."""
    while True:
        try:
            return list(cycles)
        except RuntimeError:
            pass


def write_stats(path):
    data = {
        name: {"spin_s": t[0], "sleep_s": t[1], "cycles": snapshot(CYCLES[name])}
        for name, t in TOTALS.items()
    }
    data["monotonic"] = time.monotonic()
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.rename(tmp, path)


def main():
    lines = harness.markers(__file__)
    LOCK.acquire()
    blocked = harness.start(threading.Thread(target=blocked_wait, name="blocked"))
    cyclers = []
    for name in ("cycler-1", "cycler-2"):
        TOTALS[name] = [0.0, 0.0]
        CYCLES[name] = collections.deque(maxlen=CYCLES_KEPT)
        cyclers.append(harness.start(threading.Thread(target=cycle, args=(name,), name=name)))
    harness.wait_until_at({blocked: (blocked_wait.__code__, lines["blocked"])})
    # Every cycler has been through a whole cycle (it sits in one of its two parts).
    while any(t[1] == 0.0 for t in TOTALS.values()):
        time.sleep(0.01)
    harness.write_ready(sys.argv[1], [blocked] + cyclers)
    stats = sys.argv[2] if len(sys.argv) > 2 else None
    parent = os.getppid()
    deadline = time.monotonic() + harness.MAX_LIFETIME_S
    while time.monotonic() < deadline:
        if stats:
            write_stats(stats)
        time.sleep(0.05)
        if parent > 1 and os.getppid() != parent:
            break
    os._exit(0)


if __name__ == "__main__":
    main()
