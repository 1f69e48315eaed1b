"""Process churn for `cargo xtask bench` (memory of a long `record --all`): starts a new
short-lived CPython process every --every seconds, each busy for --life seconds 20 frames deep
(the same code in every process: what keeps coming is processes, their pids and per-process
state), until its stdin closes, it is killed, or --max-seconds pass.

Usage: python churn.py [--every S] [--life S] [--max-seconds S]
"""

import argparse
import subprocess
import sys
import threading
import time

import benchproto

CHILD = """
import sys, time
life = float(sys.argv[2])
def f(k):
    if k:
        return f(k - 1)
    end = time.monotonic() + life
    x = 0
    while time.monotonic() < end:
        x += 1
f(20)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--life", type=float, default=0.3)
    ap.add_argument("--max-seconds", type=float, default=900)
    args = ap.parse_args()
    benchproto.bound_lifetime(args.max_seconds)
    benchproto.emit("ready")
    stop = threading.Event()

    def watch():
        benchproto.wait_go()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    n = 0
    children = []
    while not stop.is_set():
        n += 1
        children.append(
            subprocess.Popen([sys.executable, "-c", CHILD, str(n), str(args.life)])
        )
        children = [c for c in children if c.poll() is None]
        time.sleep(args.every)
    for c in children:
        c.wait()


if __name__ == "__main__":
    main()
