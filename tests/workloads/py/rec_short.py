"""Workload: a short-lived Python process (`pyebpf record --all` e2e, issue 4).

Usage: python rec_short.py [CPU_SECONDS]

`main` -> `burn` spins on the line tagged `burn` until the process has used CPU_SECONDS (default
0.2) of CPU time, then the process exits. CPU time rather than wall time: on a loaded machine the
process still runs long enough to be sampled about CPU_SECONDS * rate times.
"""

import sys
import time


def burn(until):  # LINE:def_burn
    while time.process_time() < until: pass  # LINE:burn


def main():  # LINE:def_main
    burn(time.process_time() + float(sys.argv[1] if len(sys.argv) > 1 else 0.2))  # LINE:call_burn


if __name__ == "__main__":
    main()  # LINE:call_main
