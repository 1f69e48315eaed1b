"""Workload: two threads contending for the GIL (`pyebpf record --idle`, issue 13).

Usage: python rec_gilwait.py READY_FILE STATS_FILE

Threads "contend-a" and "contend-b" each run a pure-Python loop in their own function
(`contend_a`, `contend_b`, the lines tagged `a` and `b`): both always want the GIL, so a
thread that is off a CPU and not waiting for a CPU is waiting for the GIL. Each thread's truth
comes from the kernel's own accounting of it, `/proc/self/task/TID/schedstat` (time on a CPU,
time runnable waiting for one): GIL wait = wall time − CPU time − run-queue wait. The main
thread rewrites the stats file every 50 ms with, per thread, its cumulative CPU and run-queue
seconds and the monotonic time, so that a test takes the difference over its recording.
"""

import json
import os
import sys
import threading
import time

import harness


def contend_a():  # LINE:def_a
    x = 0
    while True: x += 1  # LINE:a


def contend_b():  # LINE:def_b
    x = 0
    while True: x += 1  # LINE:b


def schedstat(tid):
    """(seconds on a CPU, seconds runnable waiting for one) of a thread of this process."""
    with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
        cpu_ns, wait_ns, _ = f.read().split()
    return int(cpu_ns) / 1e9, int(wait_ns) / 1e9


def main():
    # Hand the GIL over every 1.3 ms, not CPython's default 5 ms: two threads at 5 ms make a
    # 10 ms cycle that beats against 99 Hz sampling (10.1 ms), so a few seconds of samples hold
    # only a few beat periods and the on-CPU/GIL-wait split drifted up to 10 pp from the
    # kernel's accounting on a quiet machine; 1.3 ms puts several hand-overs in every sampling
    # period and no low-order ratio between the two.
    sys.setswitchinterval(0.0013)
    lines = harness.markers(__file__)
    a = harness.start(threading.Thread(target=contend_a, name="contend-a"))
    b = harness.start(threading.Thread(target=contend_b, name="contend-b"))
    harness.wait_until_at({a: (contend_a.__code__, lines["a"]), b: (contend_b.__code__, lines["b"])})
    harness.write_ready(sys.argv[1], [a, b])
    path = sys.argv[2]
    parent = os.getppid()
    deadline = time.monotonic() + harness.MAX_LIFETIME_S
    while time.monotonic() < deadline:
        now = time.monotonic()
        data = {"monotonic": now}
        for t in (a, b):
            cpu, wait = schedstat(t.native_id)
            data[t.name] = {"cpu_s": cpu, "runqueue_s": wait}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.rename(tmp, path)
        time.sleep(0.05)
        if parent > 1 and os.getppid() != parent:
            break
    os._exit(0)


if __name__ == "__main__":
    main()
