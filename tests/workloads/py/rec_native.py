"""Workload: Python -> C -> Python (`pyebpf record --native` e2e, issue 4).

Usage: python rec_native.py READY_FILE

Thread "sorter" runs `outer` -> `middle` -> `sorted(DATA, key=pykey)` in a loop; `sorted` is C
(`builtin_sorted` -> `list_sort_impl`), and it calls the Python function `pykey`, which spins a
little per element, so most samples are in `pykey` under the C sort under `middle`. The ready
file (see harness.py) is written once the thread has been seen in `pykey`.
"""

import sys
import threading
import time

import harness

DATA = list(range(2000, 0, -1))


def pykey(v):  # LINE:def_pykey
    i = 0
    while i < 300: i += 1  # LINE:pykey_spin
    return v


def middle():  # LINE:def_middle
    return sorted(DATA, key=pykey)  # LINE:call_sorted


def outer():  # LINE:def_outer
    while True:
        middle()  # LINE:call_middle


def main():
    t = harness.start(threading.Thread(target=outer, name="sorter"))
    deadline = time.monotonic() + harness.READY_TIMEOUT_S
    while True:
        frame = sys._current_frames().get(t.ident)
        if frame is not None and frame.f_code is pykey.__code__:
            break
        if time.monotonic() > deadline:
            sys.exit("workload: sorter never seen in pykey")
        time.sleep(0.01)
    harness.write_ready(sys.argv[1], [t])
    harness.linger()


if __name__ == "__main__":
    main()
