"""Real-world workload: sympy 1.13.3 doing algebra in a loop (issue 17).

Usage: python sympy_loop.py READY_FILE [SECONDS]

The third-party packages are on PYTHONPATH (`cargo xtask setup --interpreters` installs them,
pinned, into one directory shared by every interpreter). Each iteration starts with sympy's
caches cleared, so every iteration runs the same code paths as the first. The ready file and
the loop: `measured_loop.py`.
"""

from measured_loop import run
from sympy import cos, exp, expand, factor, integrate, series, simplify, sin, symbols
from sympy.core.cache import clear_cache

x, y, z = symbols("x y z")


def work():
    clear_cache()
    e = expand((x + y + z + 1) ** 6)
    factor(e)
    integrate(x**3 * sin(x) * exp(x), x)
    simplify(sin(x) ** 2 + cos(x) ** 2 + (x**2 - 1) / (x - 1))
    series(exp(sin(x)), x, 0, 6)


if __name__ == "__main__":
    run(work)
