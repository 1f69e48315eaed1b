"""Workload: a thread spinning inside `__init__` reached through a specialised call
(`pyebpf dump` e2e).

Usage: python init_shim.py READY_FILE

On 3.13+ default builds, once the call site `Spinner(spin)` is specialised
(`CALL_ALLOC_AND_ENTER_INIT`), CPython pushes an `__init__` shim frame (code object
`_Py_InitCleanup`, owner "thread", line -1) between `Spinner.__init__` and its caller. A reader must
not report it: CPython's own view of the stack does not contain it. (3.12 and free-threaded builds
have no shim; the workload is still a valid stack test there.) The ready file's "call_site" lists
the specialised form of the CALL instructions in `make`.
"""

import dis
import sys
import threading

import harness

WARM_UP_CALLS = 1000


class Spinner:
    def __init__(self, spin):  # LINE:def_init
        if spin:
            x = 0
            while True: x += 1  # LINE:init_spin


def make(spin):  # LINE:def_make
    return Spinner(spin)  # LINE:make_call


def run():  # LINE:def_run
    for _ in range(WARM_UP_CALLS):
        make(False)
    make(True)  # LINE:run_call_make


def main():
    lines = harness.markers(__file__)
    t = harness.start(threading.Thread(target=run, name="spin-init"))
    harness.wait_until_at({t: (Spinner.__init__.__code__, lines["init_spin"])})
    call_site = [i.opname for i in dis.get_instructions(make, adaptive=True) if i.opname.startswith("CALL")]
    harness.write_ready(sys.argv[1], [t], {"call_site": call_site})
    harness.linger()


if __name__ == "__main__":
    main()
