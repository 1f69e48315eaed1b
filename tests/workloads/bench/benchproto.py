"""The line protocol between `cargo xtask bench` and its workloads (stdout/stdin, one JSON
object per line).

    workload -> harness   {"event": "ready", "pid": ..., ...}   set up, about to wait
    harness  -> workload  "go\\n"                                start the measured part
    workload -> harness   {"event": "done", ...}                results

A workload also ends when its stdin closes (the harness went away) and, whatever happens, after
`max_seconds` (SIGALRM's default action ends the process): nothing outlives a lost harness.
"""

import json
import os
import signal
import sys


def bound_lifetime(max_seconds):
    """Ends the process after `max_seconds`, whatever it is doing."""
    signal.alarm(max(1, int(max_seconds)))


def emit(event, **fields):
    fields["event"] = event
    fields.setdefault("pid", os.getpid())
    sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


def wait_go():
    """Blocks until the harness says go; exits quietly if it closed our stdin instead."""
    if not sys.stdin.readline():
        os._exit(0)
