"""Workload: four threads spinning in four different functions (`pyebpf record` e2e, issue 4).

Usage: python rec_threads4.py READY_FILE

Threads "t-alpha", "t-beta", "t-gamma" and "t-delta" each spin in their own function
(`spin_alpha` ... `spin_delta`) on the line tagged `spin_<name>`. On a free-threaded build with
the GIL disabled they run in parallel. The ready file (see harness.py) is written once every
thread sits on its line; it also records `gil_enabled`.
"""

import sys
import threading

import harness


def spin_alpha():  # LINE:def_alpha
    x = 0
    while True: x += 1  # LINE:spin_alpha


def spin_beta():  # LINE:def_beta
    x = 0
    while True: x += 1  # LINE:spin_beta


def spin_gamma():  # LINE:def_gamma
    x = 0
    while True: x += 1  # LINE:spin_gamma


def spin_delta():  # LINE:def_delta
    x = 0
    while True: x += 1  # LINE:spin_delta


def main():
    lines = harness.markers(__file__)
    where = {}
    for fn in (spin_alpha, spin_beta, spin_gamma, spin_delta):
        role = fn.__name__.removeprefix("spin_")
        t = harness.start(threading.Thread(target=fn, name=f"t-{role}"))
        where[t] = (fn.__code__, lines[f"spin_{role}"])
    harness.wait_until_at(where)
    harness.write_ready(sys.argv[1], list(where))
    harness.linger()


if __name__ == "__main__":
    main()
