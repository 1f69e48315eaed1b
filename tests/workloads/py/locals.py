"""Workload: a thread stopped in a closure, below its enclosing function, both with known
arguments and locals of every kind `pyebpf dump --locals` shows (`dump` e2e).

Usage: python locals.py READY_FILE

Thread "locals-thread" runs `outer(...)`, which defines `inner` (free variables `кириллица`
and `big`, which are cells of `outer`) and calls it; `inner` spins on one line. Before
spinning, each frame records, for every one of its local names, the value `pyebpf` must print:
`repr()` for None, bool, int, float, str and bytes; for containers the same rule pyebpf
documents (the first 8 items, 2 levels, then `...`), built from `repr()` of the items; for
other objects `<TypeName object at 0x…>`; `<unbound>` for a name without a value; and the
whole value cut to 256 characters (`...`). The ready file carries those records.
"""

import sys
import threading

import harness

MAX_ITEMS = 8
MAX_DEPTH = 2
MAX_LEN = 256
UNBOUND = "<unbound>"


class Gadget:
    pass


def _shown(v, depth):
    t = type(v)
    if v is None or t in (bool, int, float, str, bytes):
        return repr(v)
    if t in (list, tuple):
        o, c = ("[", "]") if t is list else ("(", ")")
        if depth >= MAX_DEPTH:
            return o + "..." + c
        s = ", ".join(_shown(x, depth + 1) for x in v[:MAX_ITEMS])
        if len(v) > MAX_ITEMS:
            s += ", ..."
        elif t is tuple and len(v) == 1:
            s += ","
        return o + s + c
    if t is dict:
        if depth >= MAX_DEPTH:
            return "{...}"
        items = list(v.items())
        s = ", ".join(_shown(k, depth + 1) + ": " + _shown(x, depth + 1) for k, x in items[:MAX_ITEMS])
        if len(items) > MAX_ITEMS:
            s += ", ..."
        return "{" + s + "}"
    if t in (set, frozenset):
        if depth >= MAX_DEPTH:
            return "{...}" if t is set else "frozenset({...})"
        items = list(v)
        if not items:
            return t.__name__ + "()"
        s = ", ".join(_shown(x, depth + 1) for x in items[:MAX_ITEMS])
        if len(items) > MAX_ITEMS:
            s += ", ..."
        return "{" + s + "}" if t is set else "frozenset({" + s + "})"
    return "<%s object at %#x>" % (t.__name__, id(v))


def shown(v):
    r = _shown(v, 0)
    return r if len(r) <= MAX_LEN else r[: MAX_LEN - 3] + "..."


RECORDS = {}


def record(frame_name, frame):
    """{name: [is_argument, what pyebpf must print]} for every local of `frame`."""
    code = frame.f_code
    nargs = code.co_argcount + code.co_kwonlyargcount
    nargs += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    names = list(code.co_varnames) + list(code.co_cellvars) + list(code.co_freevars)
    values = frame.f_locals
    RECORDS[frame_name] = {
        name: [i < nargs, shown(values[name]) if name in values else UNBOUND]
        for i, name in enumerate(dict.fromkeys(names))
    }


def outer(число, flag, *rest, ключ="значение", **extra):  # LINE:def_outer
    none = None
    yes, no = True, False
    small, zero = -7, 0
    big = 2**200 + 12345
    neg_big = -(3**100)
    wide = 2**64
    pi, third, tiny, huge, neg_zero, one = 3.141592653589793, 2 / 3, 1e-05, 1e16, -0.0, 1.0
    inf, nan = float("inf"), float("nan")
    ascii_s, empty = "plain", ""
    quotes = "it's \"q\""
    latin = "café\t\n\x85"
    кириллица = "Привет, мир"
    emoji = "🐍 snake \u200b"
    surrogate = "\ud800x"
    raw, no_bytes = b"\x00\xffab'", b""
    nested = [1, (2, 3), {"k": [4, 5]}, {6}, frozenset({7}), [[8]]]
    long_list = list(range(20))
    tup1 = (1,)
    d = {"a": 1, 2: "b", (3, 4): None}
    s = {1}
    fs = frozenset()
    long_text = "x" * 1000
    g = Gadget()
    𠀀 = "astral name"
    данные = "ü"
    if flag is None:
        never = 1

    def inner(arg):  # LINE:def_inner
        inner_local = (кириллица, big)
        record("inner", sys._getframe())
        while True: pass  # LINE:inner_spin

    record("outer", sys._getframe())
    inner("x")  # LINE:outer_call


def main():
    lines = harness.markers(__file__)
    t = harness.start(
        threading.Thread(
            target=outer,
            args=(42, True, "rest1", 2.5),
            kwargs={"ключ": "k", "extra1": [1, 2]},
            name="locals-thread",
        )
    )
    code = None
    while code is None:
        frame = sys._current_frames().get(t.ident)
        while frame is not None and frame.f_code.co_name != "inner":
            frame = frame.f_back
        code = frame.f_code if frame is not None else None
    harness.wait_until_at({t: (code, lines["inner_spin"])})
    harness.write_ready(sys.argv[1], [t], {"locals": RECORDS})
    harness.linger()


if __name__ == "__main__":
    main()
