"""Prints, as one JSON line, which code points this interpreter's repr() shows unescaped.

Used by `cargo xtask gen-printable` to build pyebpf's table of `Py_UNICODE_ISPRINTABLE`
(sampler-user/src/python/printable_table.rs). A code point is "printable" when `repr()` of the
one-character string is the character itself between the quotes (backslash is printable but
always escaped, so it is taken as printable; the quote characters are shown as they are).
Runs on CPython 3.6 and newer; no third-party modules.
"""

import json
import sys
import unicodedata


def printable(c):
    if c == 0x5C:
        return True
    ch = chr(c)
    return repr(ch)[1:-1] == ch


def main():
    ranges = []
    start = None
    for c in range(0x110000):
        if printable(c):
            if start is None:
                start = c
        elif start is not None:
            ranges.append([start, c - 1])
            start = None
    if start is not None:
        ranges.append([start, 0x10FFFF])
    print(
        json.dumps(
            {
                "version": "%d.%d.%d" % sys.version_info[:3],
                "unicode": unicodedata.unidata_version,
                "ranges": ranges,
            }
        )
    )


main()
