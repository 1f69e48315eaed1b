"""Workload: one thread spinning in Python, one spinning in C with the GIL released (`pyebpf
record --gil` e2e, issue 4).

Usage: python rec_gil.py READY_FILE

"py-spin" spins on the line tagged `spin` (holding the GIL but for the switch interval hand-offs);
"c-hash" hashes a 64 MiB buffer in a loop on the line tagged `hash`: hashlib releases the GIL
while it hashes a large buffer, so that thread is on CPU almost all the time without the GIL. The
ready file (see harness.py) is written once both threads sit on their lines.
"""

import hashlib
import sys
import threading

import harness

BUFFER = bytes(64 << 20)


def spin():  # LINE:def_spin
    x = 0
    while True: x += 1  # LINE:spin


def hash_forever():  # LINE:def_hash
    while True: hashlib.sha256(BUFFER)  # LINE:hash


def main():
    lines = harness.markers(__file__)
    c = harness.start(threading.Thread(target=hash_forever, name="c-hash"))
    p = harness.start(threading.Thread(target=spin, name="py-spin"))
    harness.wait_until_at(
        {c: (hash_forever.__code__, lines["hash"]), p: (spin.__code__, lines["spin"])}
    )
    harness.write_ready(sys.argv[1], [p, c])
    harness.linger()


if __name__ == "__main__":
    main()
