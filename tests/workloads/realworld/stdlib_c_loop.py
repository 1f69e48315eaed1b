"""Real-world workload: the standard library's C modules in a loop (issue 17's `--native`
measurement): `json`, `re`, `zlib`, `hashlib`, `pickle` (`_pickle`) and `sqlite3`, several of
them calling back into Python (`json`'s `default=`, `re.sub` with a function, `pickle`'s
`__reduce__`, an SQL function written in Python, `sorted` with a key), so a sample's native
stack holds one eval loop per Python → C → Python hop.

Usage: python stdlib_c_loop.py READY_FILE [SECONDS]

Same protocol as `sympy_loop.py`: two iterations run under `sys.setprofile` to measure the
deepest Python stack (`max_depth`), the ready file (JSON: `pid`, `max_depth`, `version`) is
written, then the loop runs until SECONDS have passed (default: until killed). An interpreter
built without `sqlite3` skips that part.
"""

import hashlib
import json
import os
import pickle
import re
import sys
import time
import zlib

try:
    import sqlite3
except ImportError:
    sqlite3 = None


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __reduce__(self):
        return (Point, (self.x, self.y))


def as_json(o):
    return {"x": o.x, "y": o.y}


def shout(m):
    return m.group(0).upper()


def weight(s):
    return len(s) % 7


DOC = {"items": [{"id": i, "name": f"item {i}", "tags": ["a", "b", str(i)]} for i in range(200)]}
POINTS = [Point(i, -i) for i in range(300)]
TEXT = " ".join(f"word{i} value={i * 3}" for i in range(400))
WORD = re.compile(r"word\d+")


def work():
    s = json.dumps(DOC)
    json.loads(s)
    json.dumps(POINTS, default=as_json)
    WORD.sub(shout, TEXT)
    re.findall(r"value=(\d+)", TEXT)
    z = zlib.compress(s.encode() * 4, 6)
    zlib.decompress(z)
    for _ in range(20):
        hashlib.sha256(z).hexdigest()
    pickle.loads(pickle.dumps(POINTS))
    sorted(TEXT.split(), key=weight)
    if sqlite3 is not None:
        db = sqlite3.connect(":memory:")
        db.create_function("weight", 1, weight)
        db.execute("create table t (s text)")
        db.executemany("insert into t values (?)", ((w,) for w in TEXT.split()[:300]))
        db.execute("select sum(weight(s)) from t").fetchone()
        db.close()


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
