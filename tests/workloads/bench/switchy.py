"""Fixed-work, context-switch-heavy benchmark for `cargo xtask bench` (figure 8, `--idle`).

Usage: python switchy.py --scale N [--sleeper] [--max-seconds S]

Two Python threads hand a token back and forth N * 20000 times through two semaphores: each
hand-off blocks one thread in `futex` and wakes the other, so the process switches context tens
of thousands of times a second, each time with a Python stack — the worst case for an off-CPU
profiler. The work is timed by the workload (`time.perf_counter`, `time.process_time`) after
the harness says go (benchproto.py). With --sleeper it only sleeps until its stdin closes: a
Python process that is a target but hardly ever switches (the switches on the host are then
everyone else's).
"""

import argparse
import sys
import threading
import time

import benchproto


def ping(n, mine, theirs):
    for _ in range(n):
        mine.acquire()
        theirs.release()


def pong(n, mine, theirs):
    for _ in range(n):
        mine.acquire()
        theirs.release()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--sleeper", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=600)
    args = ap.parse_args()
    benchproto.bound_lifetime(args.max_seconds)
    if args.sleeper:
        benchproto.emit("ready", python=sys.version.split()[0])
        sys.stdin.readline()
        return
    n = int(args.scale * 20000)
    a, b = threading.Semaphore(0), threading.Semaphore(0)
    go = threading.Event()

    def run(fn, mine, theirs):
        go.wait()
        fn(n, mine, theirs)

    threads = [
        threading.Thread(target=run, args=(ping, a, b), name="ping"),
        threading.Thread(target=run, args=(pong, b, a), name="pong"),
    ]
    for t in threads:
        t.start()
    benchproto.emit("ready", python=sys.version.split()[0], passes=n)
    benchproto.wait_go()
    cpu0, t0 = time.process_time(), time.perf_counter()
    go.set()
    a.release()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    benchproto.emit("done", wall_s=wall, cpu_s=time.process_time() - cpu0, errors=[])


if __name__ == "__main__":
    main()
