"""Workload: a thread per request (`pyebpf record --threads` e2e, issue 17).

Usage: python rec_requests.py READY_FILE LOG_FILE

The main thread starts threads two at a time, each named `req-N` (N counting from 1), each
burning 20-50 ms of its own CPU time in `handle` (the line tagged `handle`), then ending; the
main thread waits for them (off a CPU) and starts the next two. After each pair it appends
`NAME NATIVE_ID` per thread to LOG_FILE, so a test can check which thread carried which name.
The ready file (see harness.py) is written after the first pair ended.
"""

import os
import sys
import threading
import time

import harness


def handle(ms):  # LINE:def_handle
    until = time.thread_time() + ms / 1000
    while time.thread_time() < until: pass  # LINE:handle


def main():
    parent = os.getppid()
    deadline = time.monotonic() + harness.MAX_LIFETIME_S
    n = 0
    with open(sys.argv[2], "a", encoding="utf-8") as log:
        while time.monotonic() < deadline and os.getppid() == parent:
            pair = []
            for _ in range(2):
                n += 1
                ms = 20 + (n * 7) % 31
                pair.append(threading.Thread(target=handle, args=(ms,), name=f"req-{n}"))
            for t in pair:
                t.start()
            for t in pair:
                t.join()
                log.write(f"{t.name} {t.native_id}\n")
            log.flush()
            if n == 2:
                harness.write_ready(sys.argv[1], [])
    os._exit(0)


if __name__ == "__main__":
    main()
