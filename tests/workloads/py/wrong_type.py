"""Workload: a code object whose `co_qualname` points at an `int` (issue 15), as a corrupted or
hostile process could make it. The reader must check the type and show `<invalid>`.

Usage: python wrong_type.py READY_FILE

Thread "spinner" runs `K.spin`, whose code object's qualified-name pointer is overwritten (with
ctypes) by the address of an int object kept alive here.
"""

import ctypes
import sys
import threading

import harness

NOT_A_STR = 1234567891011


class K:
    def spin(self):  # LINE:def_spin
        x = 0
        while True: x += 1  # LINE:spin


def main():
    code = K.spin.__code__
    raw = ctypes.string_at(id(code), 512)
    at = raw.find(id(code.co_qualname).to_bytes(8, sys.byteorder))
    if at < 0:
        sys.exit("workload: co_qualname not found in the code object")
    ctypes.memmove(id(code) + at, id(NOT_A_STR).to_bytes(8, sys.byteorder), 8)
    lines = harness.markers(__file__)
    t = harness.start(threading.Thread(target=K().spin, name="spinner"))
    harness.wait_until_at({t: (code, lines["spin"])})
    harness.write_ready(sys.argv[1], [t])
    harness.linger()


if __name__ == "__main__":
    main()
