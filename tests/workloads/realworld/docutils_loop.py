"""Real-world workload: docutils 0.21.2 turning a reStructuredText document into HTML in a loop
(issue 17's bench: a parser and writer, many small functions).

Usage: python docutils_loop.py READY_FILE [SECONDS]

Like `sympy_loop.py`: the package is on PYTHONPATH; two conversions run under `sys.setprofile`
to measure the deepest Python stack (`max_depth`, frames from `<module>` to the innermost), the
ready file (JSON: `pid`, `max_depth`, `version`) is written, then conversions run until SECONDS
have passed (default: until killed).
"""

import json
import os
import sys
import time

from docutils.core import publish_string

SECTION = """
Section {n}
===========

A paragraph with *emphasis*, **strong text**, ``literals`` and a `link <https://example.org/{n}>`_.

- item one, with a footnote [#]_
- item two

  1. nested
  2. list

.. [#] The footnote of section {n}.

====  =====  ======
A     B      A or B
====  =====  ======
no    no     no
yes   no     yes
====  =====  ======

.. note:: An admonition in section {n}.

::

    literal block {n}
"""

DOCUMENT = "Title\n#####\n" + "".join(SECTION.format(n=n) for n in range(12))


def work():
    publish_string(
        DOCUMENT,
        writer_name="html5",
        settings_overrides={"report_level": 5, "halt_level": 5},
    )


def depth_of(frame):
    n = 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


def deepest(iterations):
    """The deepest Python stack reached while running `work` `iterations` times."""
    state = {"depth": depth_of(sys._getframe()), "max": 0}

    def profile(frame, event, arg):
        if event == "call":
            state["depth"] += 1
            state["max"] = max(state["max"], state["depth"])
        elif event == "return":
            state["depth"] -= 1

    sys.setprofile(profile)
    try:
        for _ in range(iterations):
            work()
    finally:
        sys.setprofile(None)
    return state["max"]


def main():
    ready = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else None
    # `deepest` adds its own frame under `work`; the loop calls `work` from `main`.
    max_depth = deepest(2) - 1
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "max_depth": max_depth,
                "version": "%d.%d.%d" % sys.version_info[:3],
            },
            f,
        )
    os.rename(tmp, ready)
    deadline = None if seconds is None else time.monotonic() + seconds
    while deadline is None or time.monotonic() < deadline:
        work()


if __name__ == "__main__":
    main()
