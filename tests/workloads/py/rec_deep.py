"""Workload: one thread spinning at a known depth-20 stack (`pyebpf record` e2e, issue 4).

Usage: python rec_deep.py READY_FILE

Thread "deep20" runs f1 -> f2 -> ... -> f20, twenty distinct functions (no recursion), and f20
spins on the single line tagged `spin`, so every sample of that thread has the same Python stack.
The ready file (see harness.py) is written once the thread sits on that line.
"""

import sys
import threading

import harness


def f1():  # LINE:def_f1
    f2()  # LINE:call_f2


def f2():  # LINE:def_f2
    f3()  # LINE:call_f3


def f3():  # LINE:def_f3
    f4()  # LINE:call_f4


def f4():  # LINE:def_f4
    f5()  # LINE:call_f5


def f5():  # LINE:def_f5
    f6()  # LINE:call_f6


def f6():  # LINE:def_f6
    f7()  # LINE:call_f7


def f7():  # LINE:def_f7
    f8()  # LINE:call_f8


def f8():  # LINE:def_f8
    f9()  # LINE:call_f9


def f9():  # LINE:def_f9
    f10()  # LINE:call_f10


def f10():  # LINE:def_f10
    f11()  # LINE:call_f11


def f11():  # LINE:def_f11
    f12()  # LINE:call_f12


def f12():  # LINE:def_f12
    f13()  # LINE:call_f13


def f13():  # LINE:def_f13
    f14()  # LINE:call_f14


def f14():  # LINE:def_f14
    f15()  # LINE:call_f15


def f15():  # LINE:def_f15
    f16()  # LINE:call_f16


def f16():  # LINE:def_f16
    f17()  # LINE:call_f17


def f17():  # LINE:def_f17
    f18()  # LINE:call_f18


def f18():  # LINE:def_f18
    f19()  # LINE:call_f19


def f19():  # LINE:def_f19
    f20()  # LINE:call_f20


def f20():  # LINE:def_f20
    x = 0
    while True: x += 1  # LINE:spin


def main():
    lines = harness.markers(__file__)
    t = harness.start(threading.Thread(target=f1, name="deep20"))
    harness.wait_until_at({t: (f20.__code__, lines["spin"])})
    harness.write_ready(sys.argv[1], [t])
    harness.linger()


if __name__ == "__main__":
    main()
