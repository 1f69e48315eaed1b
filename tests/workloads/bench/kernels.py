"""Fixed-work, CPU-bound, pure-Python benchmark for `cargo xtask bench` (target slowdown).

Usage: python kernels.py --scale N [--threads T] [--max-seconds S]

Runs four classic kernels -- n-body, Richards, spectral norm and a dict/str-heavy loop -- a fixed
amount of work each (proportional to N), after the harness says go (see benchproto.py), and
reports the wall time of that work. With --threads T the same total work is split across T
threads started before "ready" and released together (T=100: the case where a profiler that
stops every thread per sample hurts most); the GIL serialises them, so the work is the same.

Each kernel checks its own result, so a profiler that corrupted the target would show up as an
error rather than as a fast run.
"""

import argparse
import sys
import threading
import time

import benchproto

# ---------------------------------------------------------------------------------------------
# n-body (the Computer Language Benchmarks Game's planets, advanced with a fixed step).

SOLAR_MASS = 4 * 3.141592653589793 ** 2
DAYS_PER_YEAR = 365.24
PLANETS = [
    ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], SOLAR_MASS),
    (
        [4.84143144246472090e00, -1.16032004402742839e00, -1.03622044471123109e-01],
        [1.66007664274403694e-03, 7.69901118419740425e-03, -6.90460016972063023e-05],
        9.54791938424326609e-04,
    ),
    (
        [8.34336671824457987e00, 4.12479856412430479e00, -4.03523417114321381e-01],
        [-2.76742510726862411e-03, 4.99852801234917238e-03, 2.30417297573763929e-05],
        2.85885980666130812e-04,
    ),
    (
        [1.28943695621391310e01, -1.51111514016986312e01, -2.23307578892655734e-01],
        [2.96460137564761618e-03, 2.37847173959480950e-03, -2.96589568540237556e-05],
        4.36624404335156298e-05,
    ),
    (
        [1.53796971148509165e01, -2.59193146099879641e01, 1.79258772950371181e-01],
        [2.68067772490389322e-03, 1.62824170038242295e-03, -9.51592254519715870e-05],
        5.15138902046611451e-05,
    ),
]


def nbody_energy(bodies, pairs):
    e = 0.0
    for ((x1, y1, z1), v1, m1), ((x2, y2, z2), v2, m2) in pairs:
        dx, dy, dz = x1 - x2, y1 - y2, z1 - z2
        e -= (m1 * m2) / ((dx * dx + dy * dy + dz * dz) ** 0.5)
    for _, (vx, vy, vz), m in bodies:
        e += m * (vx * vx + vy * vy + vz * vz) / 2.0
    return e


def nbody_advance(bodies, pairs, dt, steps):
    for _ in range(steps):
        for ([x1, y1, z1], v1, m1), ([x2, y2, z2], v2, m2) in pairs:
            dx, dy, dz = x1 - x2, y1 - y2, z1 - z2
            mag = dt * ((dx * dx + dy * dy + dz * dz) ** -1.5)
            b1m, b2m = m1 * mag, m2 * mag
            v1[0] -= dx * b2m
            v1[1] -= dy * b2m
            v1[2] -= dz * b2m
            v2[0] += dx * b1m
            v2[1] += dy * b1m
            v2[2] += dz * b1m
        for r, (vx, vy, vz), _ in bodies:
            r[0] += dt * vx
            r[1] += dt * vy
            r[2] += dt * vz


def nbody(steps):
    bodies = [(list(p), [v * DAYS_PER_YEAR for v in vel], m * SOLAR_MASS if i else m)
              for i, (p, vel, m) in enumerate(PLANETS)]
    # Offset the sun's momentum so the system's centre of mass stays put.
    px = py = pz = 0.0
    for _, (vx, vy, vz), m in bodies:
        px, py, pz = px + vx * m, py + vy * m, pz + vz * m
    sun_v = bodies[0][1]
    sun_v[0], sun_v[1], sun_v[2] = -px / SOLAR_MASS, -py / SOLAR_MASS, -pz / SOLAR_MASS
    pairs = [(bodies[i], bodies[j]) for i in range(len(bodies)) for j in range(i + 1, len(bodies))]
    before = nbody_energy(bodies, pairs)
    nbody_advance(bodies, pairs, 0.01, steps)
    after = nbody_energy(bodies, pairs)
    if not (-0.17 < before < -0.16 and abs(after - before) < 1e-3):
        raise AssertionError(f"n-body energy {before} -> {after}")
    return after


# ---------------------------------------------------------------------------------------------
# Richards: Martin Richards' operating-system task scheduler simulation.

I_IDLE, I_WORK, I_HANDLERA, I_HANDLERB, I_DEVA, I_DEVB = 1, 2, 3, 4, 5, 6
K_DEV, K_WORK = 1000, 1001
BUFSIZE = 3  # packets carry BUFSIZE + 1 data bytes
PKTBIT, WAITBIT, HOLDBIT = 1, 2, 4
ALPHABET = "0ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class Packet:
    __slots__ = ("link", "ident", "kind", "a1", "a2")

    def __init__(self, link, ident, kind):
        self.link, self.ident, self.kind, self.a1, self.a2 = link, ident, kind, 0, [0] * (BUFSIZE + 1)


class Task:
    __slots__ = ("link", "ident", "pri", "wkq", "state", "fn", "v1", "v2")

    def __init__(self, link, ident, pri, wkq, state, fn, v1, v2):
        self.link, self.ident, self.pri, self.wkq = link, ident, pri, wkq
        self.state, self.fn, self.v1, self.v2 = state, fn, v1, v2


def append(pkt, head):
    pkt.link = None
    if head is None:
        return pkt
    p = head
    while p.link is not None:
        p = p.link
    p.link = pkt
    return head


class Richards:
    def __init__(self, count):
        self.tasks = {}
        self.tasklist = None
        self.cur = None
        self.qpkt_count = self.hold_count = 0
        self.create(I_IDLE, 0, None, 0, self.idle_fn, 1, count)
        wkq = Packet(Packet(None, 0, K_WORK), 0, K_WORK)
        self.create(I_WORK, 1000, wkq, WAITBIT | PKTBIT, self.work_fn, I_HANDLERA, 0)
        wkq = Packet(Packet(Packet(None, I_DEVA, K_DEV), I_DEVA, K_DEV), I_DEVA, K_DEV)
        self.create(I_HANDLERA, 2000, wkq, WAITBIT | PKTBIT, self.handler_fn, None, None)
        wkq = Packet(Packet(Packet(None, I_DEVB, K_DEV), I_DEVB, K_DEV), I_DEVB, K_DEV)
        self.create(I_HANDLERB, 3000, wkq, WAITBIT | PKTBIT, self.handler_fn, None, None)
        self.create(I_DEVA, 4000, None, WAITBIT, self.dev_fn, None, None)
        self.create(I_DEVB, 5000, None, WAITBIT, self.dev_fn, None, None)

    def create(self, ident, pri, wkq, state, fn, v1, v2):
        t = Task(self.tasklist, ident, pri, wkq, state, fn, v1, v2)
        self.tasklist = t
        self.tasks[ident] = t

    def schedule(self):
        t = self.tasklist
        while t is not None:
            pkt = None
            state = t.state
            if state == WAITBIT | PKTBIT:
                pkt = t.wkq
                t.wkq = pkt.link
                t.state = PKTBIT if t.wkq is not None else 0
                state = t.state
            if state in (0, PKTBIT):
                self.cur = t
                t = t.fn(pkt)
            elif state & (WAITBIT | HOLDBIT):
                t = t.link
            else:
                return

    def wait(self):
        self.cur.state |= WAITBIT
        return self.cur

    def hold_self(self):
        self.hold_count += 1
        self.cur.state |= HOLDBIT
        return self.cur.link

    def release(self, ident):
        t = self.tasks[ident]
        t.state &= ~HOLDBIT
        return t if t.pri > self.cur.pri else self.cur

    def qpkt(self, pkt):
        t = self.tasks[pkt.ident]
        self.qpkt_count += 1
        pkt.link = None
        pkt.ident = self.cur.ident
        if t.wkq is None:
            t.wkq = pkt
            t.state |= PKTBIT
            if t.pri > self.cur.pri:
                return t
        else:
            append(pkt, t.wkq)
        return self.cur

    def idle_fn(self, pkt):
        t = self.cur
        t.v2 -= 1
        if t.v2 == 0:
            return self.hold_self()
        if t.v1 & 1 == 0:
            t.v1 = t.v1 >> 1
            return self.release(I_DEVA)
        t.v1 = (t.v1 >> 1) ^ 0xD008
        return self.release(I_DEVB)

    def work_fn(self, pkt):
        if pkt is None:
            return self.wait()
        t = self.cur
        t.v1 = I_HANDLERA + I_HANDLERB - t.v1
        pkt.ident = t.v1
        pkt.a1 = 0
        for i in range(BUFSIZE + 1):
            t.v2 += 1
            if t.v2 > 26:
                t.v2 = 1
            pkt.a2[i] = ALPHABET[t.v2]
        return self.qpkt(pkt)

    def handler_fn(self, pkt):
        t = self.cur
        if pkt is not None:
            if pkt.kind == K_WORK:
                t.v1 = append(pkt, t.v1)
            else:
                t.v2 = append(pkt, t.v2)
        if t.v1 is not None:
            work = t.v1
            count = work.a1
            if count > BUFSIZE:
                t.v1 = work.link
                return self.qpkt(work)
            if t.v2 is not None:
                dev = t.v2
                t.v2 = dev.link
                dev.a1 = work.a2[count]
                work.a1 = count + 1
                return self.qpkt(dev)
        return self.wait()

    def dev_fn(self, pkt):
        t = self.cur
        if pkt is None:
            if t.v1 is None:
                return self.wait()
            pkt, t.v1 = t.v1, None
            return self.qpkt(pkt)
        t.v1 = pkt
        return self.hold_self()


def richards(iterations):
    for _ in range(iterations):
        r = Richards(10000)
        r.schedule()
        # The reference counts for Count = 10000.
        if (r.qpkt_count, r.hold_count) != (23246, 9297):
            raise AssertionError(f"richards counts {r.qpkt_count} {r.hold_count}")
    return iterations


# ---------------------------------------------------------------------------------------------
# Spectral norm of the infinite matrix A(i, j) = 1 / ((i + j)(i + j + 1) / 2 + i + 1).

def spectral_a(i, j):
    return 1.0 / ((i + j) * (i + j + 1) // 2 + i + 1)


def spectral_av(u):
    n = len(u)
    return [sum(spectral_a(i, j) * u[j] for j in range(n)) for i in range(n)]


def spectral_atv(u):
    n = len(u)
    return [sum(spectral_a(j, i) * u[j] for j in range(n)) for i in range(n)]


def spectral_norm(n):
    u = [1.0] * n
    for _ in range(10):
        v = spectral_atv(spectral_av(u))
        u = spectral_atv(spectral_av(v))
    vbv = sum(a * b for a, b in zip(u, v))
    vv = sum(b * b for b in v)
    norm = (vbv / vv) ** 0.5
    if abs(norm - 1.2742) > 1e-3:
        raise AssertionError(f"spectral norm {norm}")
    return norm


# ---------------------------------------------------------------------------------------------
# Dict- and str-heavy: keys built by formatting, counted, sorted, joined and split again.

def dict_str(rounds):
    words = [f"w{i % 997}-{i % 13}" for i in range(1500)]
    total = 0
    for r in range(rounds):
        counts = {}
        for w in words:
            key = w.upper() + str(r & 7)
            counts[key] = counts.get(key, 0) + 1
        joined = ",".join(sorted(counts))
        parts = {p[:4]: len(p) for p in joined.split(",")}
        total += len(joined) + len(parts)
    if total <= 0:
        raise AssertionError("dict_str")
    return total


def spectral_norms(count):
    return [spectral_norm(40) for _ in range(count)]


# Work per unit of --scale: (name, function, argument). Each kernel's unit is roughly 0.1 s of
# CPU with CPython 3.13 on this project's 2-core VM, so one unit of everything is ~0.4 s.
KERNELS = [
    ("nbody", nbody, 16000),
    ("richards", richards, 2),
    ("spectral_norm", spectral_norms, 6),
    ("dict_str", dict_str, 100),
]


def run_work(scale, index, nthreads, times):
    """Thread `index` of `nthreads`' share of `scale` units of every kernel: the total is split
    in whole calls, so the work done is the same whatever the thread count."""
    for name, fn, per_unit in KERNELS:
        total = max(1, round(per_unit * scale))
        amount = total // nthreads + (1 if index < total % nthreads else 0)
        if amount == 0:
            continue
        t0 = time.perf_counter()
        fn(amount)
        times[name] = times.get(name, 0.0) + time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=600)
    args = ap.parse_args()
    benchproto.bound_lifetime(args.max_seconds)
    times = {}
    errors = []
    go = threading.Event()

    def worker(index):
        go.wait()
        try:
            run_work(args.scale, index, args.threads, {})
        except Exception as e:  # reported, not raised: the harness reads stdout
            errors.append(repr(e))

    threads = []
    if args.threads > 1:
        threads = [threading.Thread(target=worker, args=(i,), name=f"bench-{i}") for i in range(args.threads)]
        for t in threads:
            t.start()
    benchproto.emit("ready", threads=args.threads, python=sys.version.split()[0])
    benchproto.wait_go()
    cpu0, t0 = time.process_time(), time.perf_counter()
    if threads:
        go.set()
        for t in threads:
            t.join()
    else:
        try:
            run_work(args.scale, 0, 1, times)
        except Exception as e:
            errors.append(repr(e))
    wall = time.perf_counter() - t0
    benchproto.emit("done", wall_s=wall, cpu_s=time.process_time() - cpu0, kernels=times,
                    errors=errors)


if __name__ == "__main__":
    main()
