"""Process churn for `cargo xtask soak`: short-lived CPython processes, one after another.

Starts COUNT processes over SECONDS (evenly, a few at a time), round robin over the PYTHON
interpreters given. Each one goes six frames deep into `burn` and spins there for a random
10-200 ms of CPU time (seeded: the same run every time; CPU time, so that a loaded machine
stretches the run instead of shrinking what is sampled), then prints `pid interpreter
burned_ms` (the CPU time it really spun, by its own clock) and exits. The driver writes those lines to OUT, one per
process that finished, and `done N` at the end.

Usage: python driver.py --seconds S --count N --out FILE PYTHON [PYTHON...]
"""

import argparse
import random
import subprocess
import sys
import time

CHILD = r"""
import os, sys, time
def burn(ms):
    t0 = time.process_time()
    end = t0 + ms / 1000.0
    x = 0
    while time.process_time() < end:
        x += 1
    return (time.process_time() - t0) * 1000.0
def level(n, ms):
    return level(n - 1, ms) if n else burn(ms)
spun = level(5, float(sys.argv[1]))
sys.stdout.write("%d %s %.1f\n" % (os.getpid(), sys.argv[2], spun))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("pythons", nargs="+")
    args = ap.parse_args()
    rng = random.Random(16)
    start = time.monotonic()
    running = []
    done = 0
    with open(args.out, "w") as out:

        def reap(block):
            nonlocal done
            for p in list(running):
                if block or p.poll() is not None:
                    line = p.communicate()[0].strip()
                    running.remove(p)
                    if p.returncode == 0 and line:
                        out.write(line + "\n")
                        done += 1

        for i in range(args.count):
            due = start + args.seconds * i / args.count
            while time.monotonic() < due:
                reap(False)
                time.sleep(0.005)
            python = args.pythons[i % len(args.pythons)]
            ms = rng.uniform(10, 200)
            running.append(
                subprocess.Popen(
                    [python, "-c", CHILD, "%.1f" % ms, python],
                    stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
            )
            reap(False)
        reap(True)
        out.write("done %d\n" % done)


if __name__ == "__main__":
    main()
