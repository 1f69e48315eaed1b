"""Workload: the main interpreter's main thread and a thread of a sub-interpreter, both spinning
(`pyebpf record` e2e of sub-interpreters).

Usage: python rec_subinterp.py READY_FILE

The main thread creates an isolated sub-interpreter (3.13+: `_interpreters`; 3.12:
`_xxsubinterpreters`, which keeps the sub-interpreter's initial thread state, created by the main
thread and carrying its native id) and runs code in it that imports this very file and starts
thread "sub-spinner" there (non-daemon: isolated interpreters refuse daemon threads). That thread
writes its native id to `sub_tid` next to READY_FILE and spins in `sub_spin` on the line tagged
`sub_spin`. The main thread then spins in `main_spin` on the line tagged `main_spin` while a
daemon "watcher" thread waits for both, writes the ready file (threads "MainThread" and
"sub-spinner"; see harness.py) and lingers. The sub-interpreter is the newest one, so it heads
`_PyRuntime.interpreters`.
"""

import os
import sys
import threading
import time

import harness

SUB_CODE = """\
import sys
sys.path.insert(0, {dir!r})
import rec_subinterp
rec_subinterp.sub_start({id_path!r})
"""


def main_spin():  # LINE:def_main_spin
    x = 0
    while True: x += 1  # LINE:main_spin


def sub_spin():  # LINE:def_sub_spin
    x = 0
    while True: x += 1  # LINE:sub_spin


def sub_thread(id_path):
    """Runs in the sub-interpreter: reports this thread's native id, then spins."""
    tmp = id_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(str(threading.get_native_id()))
    os.rename(tmp, id_path)
    sub_spin()  # LINE:call_sub_spin


def sub_start(id_path):
    """Runs in the sub-interpreter (called by SUB_CODE): starts the spinning thread."""
    threading.Thread(target=sub_thread, args=(id_path,), name="sub-spinner").start()


# The sub-interpreter's id (3.12 destroys the interpreter with the last reference to it).
SUB_ID = None


def run_in_subinterpreter(code):
    """Creates an isolated sub-interpreter and runs `code` in it on this thread."""
    global SUB_ID
    try:
        import _interpreters  # 3.13+
    except ImportError:
        import _xxsubinterpreters as legacy  # 3.12

        SUB_ID = legacy.create()
        legacy.run_string(SUB_ID, code)
        return
    SUB_ID = _interpreters.create()
    err = _interpreters.exec(SUB_ID, code)
    if err is not None:
        sys.exit(f"workload: the sub-interpreter failed: {err}")


def watch(ready, id_path, lines):
    """Waits for both spinning threads, writes the ready file, keeps the process alive."""
    deadline = time.monotonic() + harness.READY_TIMEOUT_S
    while not os.path.exists(id_path):
        if time.monotonic() > deadline:
            print("workload: the sub-interpreter thread never reported its id", file=sys.stderr)
            os._exit(1)
        time.sleep(0.01)
    with open(id_path, encoding="utf-8") as f:
        sub_tid = int(f.read())
    main = threading.main_thread()
    harness.wait_until_at({main: (main_spin.__code__, lines["main_spin"])})
    # The sub thread wrote its id one call before its loop: let it get there.
    time.sleep(0.2)
    harness.write_ready(
        ready,
        [main],
        extra={
            "threads": {
                main.name: {
                    "native_id": main.native_id,
                    "ident": main.ident,
                    "stack": harness.stack_of(main.ident),
                },
                "sub-spinner": {"native_id": sub_tid},
            }
        },
    )
    harness.linger()


def main():
    lines = harness.markers(__file__)
    ready = sys.argv[1]
    id_path = os.path.join(os.path.dirname(os.path.abspath(ready)), "sub_tid")
    here = os.path.dirname(os.path.abspath(__file__))
    run_in_subinterpreter(SUB_CODE.format(dir=here, id_path=id_path))
    threading.Thread(target=watch, args=(ready, id_path, lines), name="watcher", daemon=True).start()
    main_spin()  # LINE:call_main_spin


if __name__ == "__main__":
    main()
