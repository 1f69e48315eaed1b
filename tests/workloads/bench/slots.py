"""Time-stamped stacks for `cargo xtask bench` (start-up latency: command start -> first sample).

Usage: python slots.py [--slot-ms MS] [--max-seconds S]

A worker thread spins through consecutive time slots of MS milliseconds (default 10) counted
from an epoch on CLOCK_MONOTONIC (time.monotonic()). During slot k it runs a function named
bslot_<k> (five digits) and carries the same name as its thread name (comm, and the `threading`
name), so any profiler's output dates its samples: by Python function name, or by thread name for
a profiler that shows threads but not yet Python frames. The epoch is reported in the "ready" line; the process runs
until its stdin closes, it is killed, or --max-seconds pass.
"""

import argparse
import sys
import threading
import time
import types

import benchproto

MAX_SLOT = 99999


def _slot_body(deadline):
    x = 0
    while time.monotonic() < deadline:
        x += 1
    return x


def slot_function(k):
    name = f"bslot_{k:05d}"
    extra = {"co_qualname": name} if sys.version_info >= (3, 11) else {}
    code = _slot_body.__code__.replace(co_name=name, **extra)
    return name, types.FunctionType(code, globals(), name)


def worker(epoch, slot_s, started):
    comm = f"/proc/self/task/{threading.get_native_id()}/comm"
    me = threading.current_thread()
    k = 0
    while True:
        name, fn = slot_function(k)
        me.name = name  # for profilers that name threads by their `threading` name
        try:
            with open(comm, "w") as f:
                f.write(name)
        except OSError:
            pass
        if k == 0:
            started.set()
        fn(epoch + (k + 1) * slot_s)
        # A late slot (preempted, GIL) is skipped rather than replayed.
        k = min(MAX_SLOT, max(k + 1, int((time.monotonic() - epoch) / slot_s)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slot-ms", type=float, default=10.0)
    ap.add_argument("--max-seconds", type=float, default=600)
    args = ap.parse_args()
    benchproto.bound_lifetime(args.max_seconds)
    slot_s = args.slot_ms / 1000.0
    started = threading.Event()
    epoch = time.monotonic()
    threading.Thread(target=worker, args=(epoch, slot_s, started), daemon=True).start()
    started.wait()
    benchproto.emit("ready", epoch_monotonic_s=epoch, slot_s=slot_s)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
