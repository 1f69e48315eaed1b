"""Real-world workload: docutils 0.21.2 turning a reStructuredText document into HTML in a loop
(issue 17's bench: a parser and writer, many small functions).

Usage: python docutils_loop.py READY_FILE [SECONDS]

The package is on PYTHONPATH; the ready file and the loop: `measured_loop.py`.
"""

from docutils.core import publish_string
from measured_loop import run

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


if __name__ == "__main__":
    run(work)
