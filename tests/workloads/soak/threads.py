"""Thread churn for `cargo xtask soak` (run by a free-threaded 3.13t): batches of four threads,
each spinning 5-50 ms three frames deep, started and joined over and over until killed."""

import random
import threading
import time


def spin(ms):
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        x += 1


def outer(ms):
    spin(ms)


rng = random.Random(13)
while True:
    ts = [threading.Thread(target=outer, args=(rng.uniform(5, 50),)) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
