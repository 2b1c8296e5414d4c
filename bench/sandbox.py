"""Sandbox benchmark: latency (p50/p95) and throughput per backend, stateless vs persistent, 1 and 64
concurrent sessions, memory per session. Not a test; prints a Markdown table.

    .venv/bin/python bench/sandbox.py                       # bwrap, docker (if up), e2b-local
    .venv/bin/python bench/sandbox.py --backends bwrap --n 200

Targets (docs/sandboxes.md): persistent cell p50 <= 1 ms, stateless bwrap p50 <= 20 ms, 100 concurrent
persistent bwrap sessions in <= 2 GiB.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes import IsolationUnavailable, Limits, make_sandbox
from sandboxes.process import descendants

CELL = "x = x + 1 if 'x' in globals() else 0\nx"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = fn()
        out.append(time.perf_counter() - t0)
        assert r.error is None, r
    return out


def concurrent_cells(sb, sessions: int, cells: int) -> tuple[float, list[float]]:
    """Throughput (cells/s) and per-cell latencies with ``sessions`` sessions each running ``cells``."""
    ss = list(concurrent.futures.ThreadPoolExecutor(16).map(lambda _: sb.session(), range(sessions)))
    lat: list[float] = []
    try:
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(sessions) as ex:
            for xs in ex.map(lambda s: timed(lambda: s.run(CELL), cells), ss):
                lat += xs
        wall = time.perf_counter() - t0
    finally:
        for s in ss:
            s.close()
    return sessions * cells / wall, lat


def tree_pss_bytes() -> int:
    """Proportional set size of every process descended from us (the sandboxes' processes)."""
    total = 0
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def memory_per_session(sb, n: int) -> float:
    if sb.name == "docker":
        ss = [sb.session() for _ in range(n)]
        try:
            usage = [
                sb.client.api.stats(c, stream=False)["memory_stats"].get("usage", 0) for c in sb.containers()
            ]
            return statistics.mean(usage) if usage else float("nan")
        finally:
            for s in ss:
                s.close()
    before = tree_pss_bytes()
    ss = [sb.session() for _ in range(n)]
    try:
        for s in ss:
            s.run("1")
        return (tree_pss_bytes() - before) / n
    finally:
        for s in ss:
            s.close()


def bench_backend(name: str, sb, args) -> list[str]:
    rows = []
    n = args.n if name != "docker" else max(10, args.n // 10)
    stateless = timed(lambda: sb.run("1 + 1"), n)
    rows.append(
        f"| {name} | stateless run | 1 | {pct(stateless, 0.5) * 1e3:.1f} | {pct(stateless, 0.95) * 1e3:.1f} | {1 / statistics.mean(stateless):.0f} |"
    )
    if name == "bwrap":
        warm = make_sandbox("bwrap", limits=sb.limits, spares=2)
        time.sleep(1.0)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            warm.run("1 + 1")
            lat.append(time.perf_counter() - t0)
            time.sleep(0.06)  # a request rate the spares can keep up with (~15/s)
        warm.close()
        rows.append(
            f"| bwrap | stateless run, 2 warm spares (15 req/s) | 1 | {pct(lat, 0.5) * 1e3:.1f} | {pct(lat, 0.95) * 1e3:.1f} | - |"
        )
    with sb.session() as s:
        s.run(CELL)
        cells = timed(lambda: s.run(CELL), args.cells)
    rows.append(
        f"| {name} | persistent cell | 1 | {pct(cells, 0.5) * 1e3:.2f} | {pct(cells, 0.95) * 1e3:.2f} | {1 / statistics.mean(cells):.0f} |"
    )
    conc = 64 if name != "e2b-local" else 16
    tput, lat = concurrent_cells(sb, conc, max(5, args.cells // 20))
    rows.append(
        f"| {name} | persistent cell | {conc} | {pct(lat, 0.5) * 1e3:.1f} | {pct(lat, 0.95) * 1e3:.1f} | {tput:.0f} |"
    )
    if name in ("bwrap", "docker"):
        k = 100 if name == "bwrap" else 16
        mem = memory_per_session(sb, k)
        rows.append(
            f"| {name} | memory per persistent session ({k} open) | {k} | {mem / 2**20:.1f} MiB | total {k * mem / 2**30:.2f} GiB | - |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="bwrap,docker,e2b-local")
    ap.add_argument("--n", type=int, default=100, help="stateless runs per backend")
    ap.add_argument("--cells", type=int, default=500, help="persistent cells per backend")
    args = ap.parse_args()
    limits = Limits(wall_s=30)
    rows = [
        "| backend | mode | sessions | p50 (ms) | p95 (ms) | throughput (/s) |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.backends.split(","):
        server = inner = None
        try:
            if name == "e2b-local":
                from sandboxes.e2b_local import LocalCodeInterpreterServer

                inner = make_sandbox("bwrap", limits=limits)
                server = LocalCodeInterpreterServer(inner)
                sb = make_sandbox("e2b", limits=limits, debug=True, sandbox_url=server.url)
            else:
                opts = (
                    {"base_url": "unix:///tmp/agentrl-docker/docker.sock"}
                    if name == "docker" and not os.environ.get("DOCKER_HOST")
                    else {}
                )
                sb = make_sandbox(name, limits=limits, **opts)
        except IsolationUnavailable as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
            continue
        try:
            rows += bench_backend(name, sb, args)
        finally:
            sb.close()
            if server is not None:
                server.close()
            if inner is not None:
                inner.close()
        print(f"done {name}", file=sys.stderr)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
