"""Workload: a process whose names are hostile (issue 15). Everything a process controls carries
ESC, BEL, CR and LF, plus XML and folded-format syntax: its comm (`prctl(PR_SET_NAME)`), a
thread's name (also its OS name), a function's qualified name and its file name.

Usage: python hostile.py READY_FILE

Thread HOSTILE_THREAD spins in a function named HOSTILE_FUNCTION compiled from a file named
HOSTILE_FILE; the ready file (see harness.py) is written once it does.
"""

import ctypes
import sys
import threading

import harness

# At most 15 bytes: the kernel's comm length.
HOSTILE_COMM = b"ev\x1b[2J\x07\r\n<x>&"
HOSTILE_THREAD = "thr\x1b]0;owned\x07\r\nFAKE Thread 1 <b>"
HOSTILE_FUNCTION = "spin\x1b[31m\x07\r\nFAKE (x.py:1);<x>&amp;"
HOSTILE_FILE = "evil\x1b[2J\x07\r\n<file>&.py"

SOURCE = "def spin():\n    x = 0\n    while True: x += 1\n"


def main():
    ctypes.CDLL(None).prctl(15, HOSTILE_COMM, 0, 0, 0)  # PR_SET_NAME of the main thread
    ns = {}
    exec(compile(SOURCE, HOSTILE_FILE, "exec"), ns)
    spin = ns["spin"]
    spin.__code__ = spin.__code__.replace(co_qualname=HOSTILE_FUNCTION, co_name="spin")
    t = harness.start(threading.Thread(target=spin, name=HOSTILE_THREAD))
    harness.wait_until_at({t: (spin.__code__, 3)})
    harness.write_ready(sys.argv[1], [t])
    harness.linger()


if __name__ == "__main__":
    main()
