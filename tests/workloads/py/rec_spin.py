"""Workload: one thread spinning at a known line (`pyebpf record --all` e2e, issue 4).

Usage: python rec_spin.py READY_FILE

Thread "spinner" runs `spin_outer` -> `spin`, which spins on the line tagged `spin`. Each test
installs this script in a directory of its own, so the file name in a frame tells the processes
apart. The ready file (see harness.py) is written once the thread sits on that line.
"""

import sys
import threading

import harness


def spin():  # LINE:def_spin
    x = 0
    while True: x += 1  # LINE:spin


def spin_outer():  # LINE:def_outer
    spin()  # LINE:call_spin


def main():
    lines = harness.markers(__file__)
    t = harness.start(threading.Thread(target=spin_outer, name="spinner"))
    harness.wait_until_at({t: (spin.__code__, lines["spin"])})
    harness.write_ready(sys.argv[1], [t])
    harness.linger()


if __name__ == "__main__":
    main()
