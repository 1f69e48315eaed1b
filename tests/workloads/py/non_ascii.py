"""Workload: non-ASCII names of every CPython string kind (`pyebpf dump` e2e).

Usage: python тест_🐍.py READY_FILE   (the test installs this file under that name)

String kinds exercised:
* kind 1 (latin-1, not ASCII): function `café`, closure `café.<locals>.crème`, thread "café-thread";
* kind 2 (UCS-2): class `Рабочий`, methods `Рабочий.крутить`, thread "поток-кириллица";
* kind 4 (UCS-4): the file name (co_filename contains 🐍), thread "🐍-змея" (identifiers cannot
  hold emoji, so the astral plane is reached through file and thread names).
"""

import sys
import threading

import harness


def café():  # LINE:def_cafe
    def crème():  # LINE:def_creme
        z = 0
        while True: z += 1  # LINE:creme_spin

    return crème()  # LINE:cafe_call_creme


def noël():  # LINE:def_noel
    return café()  # LINE:noel_call_cafe


class Рабочий:
    def крутить(self):  # LINE:def_krutit
        y = 0
        while True: y += 1  # LINE:krutit_spin

    def начать(self):  # LINE:def_nachat
        return self.крутить()  # LINE:nachat_call_krutit


def функция():  # LINE:def_funktsiya
    return Рабочий().начать()  # LINE:funktsiya_call_nachat


def змея():  # LINE:def_zmeya
    return функция()  # LINE:zmeya_call_funktsiya


def main():
    lines = harness.markers(__file__)
    crème_code = next(c for c in café.__code__.co_consts if getattr(c, "co_name", "") == "crème")
    a = harness.start(threading.Thread(target=noël, name="café-thread"))
    b = harness.start(threading.Thread(target=функция, name="поток-кириллица"))
    c = harness.start(threading.Thread(target=змея, name="🐍-змея"))
    harness.wait_until_at(
        {
            a: (crème_code, lines["creme_spin"]),
            b: (Рабочий.крутить.__code__, lines["krutit_spin"]),
            c: (Рабочий.крутить.__code__, lines["krutit_spin"]),
        }
    )
    harness.write_ready(sys.argv[1], [a, b, c])
    harness.linger()


if __name__ == "__main__":
    main()
