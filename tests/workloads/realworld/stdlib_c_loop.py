"""Real-world workload: the standard library's C modules in a loop (issue 17's `--native`
measurement): `json`, `re`, `zlib`, `hashlib`, `pickle` (`_pickle`) and `sqlite3`, several of
them calling back into Python (`json`'s `default=`, `re.sub` with a function, `pickle`'s
`__reduce__`, an SQL function written in Python, `sorted` with a key), so a sample's native
stack holds one eval loop per Python → C → Python hop.

Usage: python stdlib_c_loop.py READY_FILE [SECONDS]

The ready file and the loop: `measured_loop.py`. An interpreter built without `sqlite3` skips
that part.
"""

import hashlib
import json
import pickle
import re
import zlib

from measured_loop import run

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


if __name__ == "__main__":
    run(work)
