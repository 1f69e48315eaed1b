"""Known time split for `cargo xtask bench` (attribution accuracy), also used as a CPU hog.

Usage: python split.py --seconds S [--out FILE] [--max-seconds M] [--no-wait]

After "go" (see benchproto.py; at once with --no-wait) the main thread runs rounds of
split_sixty, split_thirty and split_ten -- work in the proportions 60/30/10 -- for S seconds,
timing each call with time.thread_time() (CPU) and time.perf_counter() (wall). The measured true
split is written to FILE as JSON and reported on stdout. Round sizes vary pseudo-randomly
(+-40 %) so that a fixed sampling period cannot lock onto the rounds' period.
"""

import argparse
import json
import random
import time

import benchproto

ROUND_UNITS = 80000  # iterations per round (all three calls): ~10 ms of CPU with CPython 3.13


def split_sixty(n):
    x = 0
    for i in range(n):
        x += i * i % 7
    return x


def split_thirty(n):
    x = 0
    for i in range(n):
        x += i * i % 7
    return x


def split_ten(n):
    x = 0
    for i in range(n):
        x += i * i % 7
    return x


FUNCS = [("split_sixty", split_sixty, 6), ("split_thirty", split_thirty, 3), ("split_ten", split_ten, 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--out")
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--no-wait", action="store_true")
    args = ap.parse_args()
    benchproto.bound_lifetime(args.max_seconds)
    rng = random.Random(5)
    cpu = {name: 0.0 for name, _, _ in FUNCS}
    wall = dict(cpu)
    benchproto.emit("ready")
    if not args.no_wait:
        benchproto.wait_go()
    end = time.perf_counter() + args.seconds
    rounds = 0
    while time.perf_counter() < end:
        units = int(ROUND_UNITS * rng.uniform(0.6, 1.4)) // 10
        for name, fn, weight in FUNCS:
            c0, w0 = time.thread_time(), time.perf_counter()
            fn(units * weight)
            cpu[name] += time.thread_time() - c0
            wall[name] += time.perf_counter() - w0
        rounds += 1
    total_cpu, total_wall = sum(cpu.values()), sum(wall.values())
    result = {
        "rounds": rounds,
        "cpu_s": cpu,
        "wall_s": wall,
        "share_cpu": {k: v / total_cpu for k, v in cpu.items()},
        "share_wall": {k: v / total_wall for k, v in wall.items()},
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, sort_keys=True)
    benchproto.emit("done", **result)


if __name__ == "__main__":
    main()
