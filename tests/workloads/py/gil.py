"""Workload: one thread spinning in Python, one blocked in C with the GIL released (`pyebpf dump`
GIL e2e).

Usage: python gil.py READY_FILE

"spinner" spins at line `spin`; "blocked" waits forever on an `Event` (a lock acquired in C with
the GIL released) at line `wait`. The main thread sleeps (GIL released) in `harness.linger`,
waking once a second.
"""

import sys
import threading

import harness

NEVER = threading.Event()


def spin():  # LINE:def_spin
    x = 0
    while True: x += 1  # LINE:spin


def block():  # LINE:def_block
    NEVER.wait()  # LINE:wait


def main():
    lines = harness.markers(__file__)
    blocked = harness.start(threading.Thread(target=block, name="blocked"))
    spinner = harness.start(threading.Thread(target=spin, name="spinner"))
    # "blocked" is inside Event.wait (threading.py) once its own frame sits on the `wait` line
    # and a frame above it exists; wait for the spinner, then for that.
    harness.wait_until_at({spinner: (spin.__code__, lines["spin"])})
    while True:
        stack = harness.stack_of(blocked.ident)
        if len(stack) >= 2 and any(
            f["function"] == "block" and f["line"] == lines["wait"] for f in stack
        ) and stack[0]["function"] != "block":
            break
        threading.Event().wait(0.01)
    harness.write_ready(sys.argv[1], [spinner, blocked])
    harness.linger()


if __name__ == "__main__":
    main()
