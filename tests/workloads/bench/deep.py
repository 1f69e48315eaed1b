"""A busy CPython process with a deep Python stack, for `cargo xtask bench` (profiler cost per
sample at high rates): it recurses DEPTH frames, then spins until its stdin closes, it is
killed, or --max-seconds pass.

Usage: python deep.py [--depth N] [--max-seconds S]
"""

import argparse
import threading

import benchproto


def spin():
    x = 0
    while True:
        x += 1


def level(n):
    if n == 0:
        return spin()
    return level(n - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=50)
    ap.add_argument("--max-seconds", type=float, default=600)
    args = ap.parse_args()
    benchproto.bound_lifetime(args.max_seconds)
    benchproto.emit("ready", depth=args.depth)
    # The harness closes stdin (or kills us) to end the run; the main thread spins meanwhile.
    threading.Thread(target=benchproto.wait_go, daemon=True).start()
    level(args.depth)


if __name__ == "__main__":
    main()
