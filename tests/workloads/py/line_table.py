"""Workload: line tables with backward line deltas and a call whose location entry starts exactly
at the CALL instruction (`pyebpf dump` e2e).

Usage: python line_table.py READY_FILE

* `gen_leaf` and `gen_mid` are compiled with `compile()` from generated source whose AST line
  numbers are rewritten so that, in bytecode order, a statement with a higher line number comes
  before the one the thread spins (or calls) on: the location tables hold negative line deltas.
* `split_call` calls `gen_mid(` on one line with its argument on the next: the argument's entry
  (a later line) directly precedes the CALL's entry (the earlier line). On 3.13+ the caller's
  `instr_ptr` points at that CALL, i.e. at the first code unit of an entry; a lookup that is not
  strict about the end of the previous entry reports the argument's line instead.

The ready file carries, under "generated", the line numbers assigned here (checked against CPython's
own `co_lines()` and `co_positions()` before anything is reported).
"""

import ast
import dis
import sys
import threading

import harness

GENERATED_FILE = "<pyebpf-generated>"
LEAF_DEF, LEAF_SPIN, LEAF_FIRST = 100, 120, 140
MID_DEF, MID_CALL, MID_FIRST = 200, 230, 260

GENERATED_SOURCE = """
def gen_leaf():
    x = 0
    while True: x += 1

def gen_mid(arg):
    a = arg + 1
    return gen_leaf()
"""


def _set_lines(node, line):
    for sub in ast.walk(node):
        if hasattr(sub, "lineno"):
            sub.lineno = line
            sub.end_lineno = line


def build_generated():
    tree = ast.parse(GENERATED_SOURCE)
    leaf, mid = tree.body
    leaf.lineno = leaf.end_lineno = LEAF_DEF
    _set_lines(leaf.body[0], LEAF_FIRST)  # x = 0
    _set_lines(leaf.body[1], LEAF_SPIN)  # while True: x += 1
    mid.lineno = mid.end_lineno = MID_DEF
    _set_lines(mid.args, MID_DEF)
    _set_lines(mid.body[0], MID_FIRST)  # a = arg + 1
    _set_lines(mid.body[1], MID_CALL)  # return gen_leaf()
    namespace = {}
    exec(compile(tree, GENERATED_FILE, "exec"), namespace)
    return namespace


GEN = build_generated()


def split_call():  # LINE:def_split_call
    return GEN["gen_mid"](  # LINE:split_call
        7)  # LINE:split_arg


def outer():  # LINE:def_outer
    return split_call()  # LINE:outer_call


def code_lines(code):
    """Lines in bytecode order: `co_lines()` (3.10+), else `co_lnotab`'s line starts."""
    if hasattr(code, "co_lines"):
        return [line for _, _, line in code.co_lines() if line]
    return [line for _, line in dis.findlinestarts(code)]


def check_tables(lines):
    """Refuses to run if the tables do not have the shape this workload is about."""
    leaf_lines = code_lines(GEN["gen_leaf"].__code__)
    mid_lines = code_lines(GEN["gen_mid"].__code__)
    assert LEAF_FIRST in leaf_lines and LEAF_SPIN in leaf_lines, leaf_lines
    assert leaf_lines.index(LEAF_FIRST) < leaf_lines.index(LEAF_SPIN), leaf_lines
    assert mid_lines.index(MID_FIRST) < mid_lines.index(MID_CALL), mid_lines
    if sys.version_info < (3, 11):
        # No location table, no CALL instruction: the strict-end case does not exist.
        return
    # In split_call, the instruction right before the CALL belongs to the argument's line.
    code = split_call.__code__
    # (3.11 puts a PRECALL on the CALL's own line before it.)
    ins = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "PRECALL")]
    call = next(k for k, i in enumerate(ins) if i.opname == "CALL")
    positions = list(code.co_positions())
    call_line = positions[ins[call].offset // 2][0]
    before_line = positions[ins[call - 1].offset // 2][0]
    assert call_line == lines["split_call"], (call_line, lines)
    assert before_line == lines["split_arg"], (before_line, lines)


def main():
    lines = harness.markers(__file__)
    check_tables(lines)
    t = harness.start(threading.Thread(target=outer, name="gen-lines"))
    harness.wait_until_at({t: (GEN["gen_leaf"].__code__, LEAF_SPIN)})
    generated = {
        "file": GENERATED_FILE,
        "leaf_def": LEAF_DEF,
        "leaf_spin": LEAF_SPIN,
        "leaf_first": LEAF_FIRST,
        "mid_def": MID_DEF,
        "mid_call": MID_CALL,
        "mid_first": MID_FIRST,
    }
    harness.write_ready(sys.argv[1], [t], {"generated": generated})
    harness.linger()


if __name__ == "__main__":
    main()
