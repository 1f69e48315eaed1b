"""Workload: two named threads spinning at known lines at depth >= 5 (`pyebpf dump` e2e).

Usage: python two_threads.py READY_FILE

"spin-func" spins in plain functions (one of them a closure: `func_level3.<locals>.inner`);
"spin-method" spins in methods (`Worker.spin`). The test finds the lines by their `# LINE:` tags;
each spinning loop is a single line, so the sampled line is deterministic.
"""

import sys
import threading

import harness


def func_leaf():  # LINE:def_func_leaf
    x = 0
    while True: x += 1  # LINE:func_spin


def func_level3():  # LINE:def_func_level3
    def inner():  # LINE:def_func_inner
        return func_leaf()  # LINE:func_call_leaf

    return inner()  # LINE:func_call_inner


def func_level2():  # LINE:def_func_level2
    return func_level3()  # LINE:func_call_level3


def func_level1():  # LINE:def_func_level1
    return func_level2()  # LINE:func_call_level2


def func_main():  # LINE:def_func_main
    func_level1()  # LINE:func_call_level1


class Worker:
    def spin(self):  # LINE:def_method_spin
        y = 0
        while True: y += 1  # LINE:method_spin

    def step3(self):  # LINE:def_method_step3
        return self.spin()  # LINE:method_call_spin

    def step2(self):  # LINE:def_method_step2
        return self.step3()  # LINE:method_call_step3

    def step1(self):  # LINE:def_method_step1
        return self.step2()  # LINE:method_call_step2


class SpinThread(threading.Thread):
    def run(self):  # LINE:def_method_run
        Worker().step1()  # LINE:method_call_step1


def main():
    lines = harness.markers(__file__)
    a = harness.start(threading.Thread(target=func_main, name="spin-func"))
    b = harness.start(SpinThread(name="spin-method"))
    harness.wait_until_at(
        {
            a: (func_leaf.__code__, lines["func_spin"]),
            b: (Worker.spin.__code__, lines["method_spin"]),
        }
    )
    harness.write_ready(sys.argv[1], [a, b])
    harness.linger()


if __name__ == "__main__":
    main()
