"""Bucketed weight sync: seconds and the sender's peak extra host memory per sync, against the
bucket size (``rollout.sync.bucket_mb``), for a ~60 M-parameter model (tiny preset h640-L12, float32,
241 MB) built locally.

The stream is what FSDP2's all-gather or LoRA's merge hands the sync: a fresh copy of each tensor
(``--stream params`` sends views of the parameters instead, what one process without LoRA sends,
which costs nothing to hold). Engines: the HF engine (its own copy of the weights, in the same
process) and, with ``--ray``, a pool of one Ray worker. Each measurement runs in a fresh process:
one warm-up sync, then the measured ones. Peak extra memory: ``VmHWM`` after the sync (reset before
it by writing 5 to ``/proc/self/clear_refs``) minus ``VmRSS`` before it, in the sending process;
split (sampled every millisecond) into its own heap (``RssAnon``) and shared memory it touched
(``RssShmem``: Ray's object store, which lives in /dev/shm and counts once per node).
Seconds: best of ``--repeats`` syncs with ``verify: off``, then one with ``verify: every`` (checksums
of 512 elements per tensor and a 32-token probe forward on both sides).

    .venv/bin/python bench/weight_sync.py              # HF engine
    .venv/bin/python bench/weight_sync.py --ray        # and a one-worker Ray pool
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.models import ensure_tiny_base, load_policy
from agentrl.sync.weight_sync import MiB, PolicyProbe, SyncSettings, sync_weights

BUCKETS = [8.0, 32.0, 128.0, 512.0, math.inf]


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class Sampler:
    """Peaks of ``RssAnon`` (the process's own heap) and ``RssShmem`` (shared memory it has mapped and
    touched: Ray's object store) over a sync, sampled every millisecond: a breakdown of VmHWM."""

    def __init__(self) -> None:
        self.anon = self.shmem = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.anon = max(self.anon, status_kib("RssAnon"))
            self.shmem = max(self.shmem, status_kib("RssShmem"))
            time.sleep(0.001)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def settle() -> None:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed heap back, so VmRSS is what is alive


def one(engine_kind: str, bucket_mb: float, stream_kind: str, repeats: int, preset: str) -> dict:
    """Measure one configuration in this process."""
    path = ensure_tiny_base(preset)
    model, tok = load_policy(path)
    engine: Any
    if engine_kind == "hf":
        from agentrl.engines.hf import HFEngine

        engine = HFEngine(copy.deepcopy(model), tok)
    else:
        from agentrl.assembly import components
        from agentrl.config import load_config
        from agentrl.rollout.ray_workers import init_ray

        init_ray(num_cpus=2)
        cfg = load_config(None, [f"model.path={path}", "run.device=cpu", "rollout.workers=1"])
        engine = components.rollout_pool(cfg, str(path), workers=1)
    probe = PolicyProbe(model, torch.device("cpu"), "float32", lambda m: None)

    def stream():
        for n, p in model.named_parameters():
            yield n, (p.detach().clone() if stream_kind == "gathered" else p.detach())

    off = SyncSettings(bucket_mb=bucket_mb, verify="off")
    sync_weights(engine, stream(), off, probe)  # warm-up
    times, peaks, anon, shmem, report = [], [], [], [], None
    for _ in range(repeats):
        settle()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = {f: status_kib(f) for f in ("VmRSS", "RssAnon", "RssShmem")}
        with Sampler() as sampler:
            t0 = time.perf_counter()
            report = sync_weights(engine, stream(), off, probe)
            times.append(time.perf_counter() - t0)
        peaks.append(status_kib("VmHWM") - before["VmRSS"])
        anon.append(sampler.anon - before["RssAnon"])
        shmem.append(sampler.shmem - before["RssShmem"])
    checked = sync_weights(engine, stream(), SyncSettings(bucket_mb=bucket_mb, verify="every"), probe)
    assert report is not None and checked.verified
    if engine_kind == "ray":
        engine.shutdown()
    return {
        "engine": engine_kind,
        "bucket_mb": bucket_mb,
        "buckets": report.buckets,
        "largest_mib": report.largest_bucket_bytes / MiB,
        "model_mib": report.bytes / MiB,
        "seconds": min(times),
        "verified_seconds": checked.seconds,
        "probe_max_abs_diff": checked.probe_max_abs_diff,
        "peak_extra_mib": max(peaks) / 1024,
        "anon_mib": max(anon) / 1024,
        "shmem_mib": max(shmem) / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h640-L12")
    ap.add_argument("--ray", action="store_true", help="also measure a one-worker Ray pool")
    ap.add_argument("--stream", choices=["gathered", "params"], default="gathered")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", nargs=2, metavar=("ENGINE", "BUCKET_MB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], float(args.one[1]), args.stream, args.repeats, args.preset)))
        return
    rows = []
    for engine in ["hf", "ray"] if args.ray else ["hf"]:
        for bucket in BUCKETS:
            cmd = [sys.executable, __file__, "--one", engine, str(bucket), "--stream", args.stream]
            cmd += ["--repeats", str(args.repeats), "--preset", args.preset]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(f"... {engine} {bucket} MiB done", file=sys.stderr)
    print(f"model {args.preset}: {rows[0]['model_mib']:.0f} MiB float32; stream: {args.stream}")
    print(
        "| engine | bucket MiB | buckets | largest MiB | sync s | with verify s | peak extra MiB "
        "(VmHWM) | of it: own heap | of it: shared memory |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        size = "whole" if math.isinf(r["bucket_mb"]) else f"{r['bucket_mb']:g}"
        print(
            f"| {r['engine']} | {size} | {r['buckets']} | {r['largest_mib']:.1f} | {r['seconds']:.3f} | "
            f"{r['verified_seconds']:.3f} | {r['peak_extra_mib']:.0f} | {r['anon_mib']:.0f} | "
            f"{r['shmem_mib']:.0f} |"
        )


if __name__ == "__main__":
    main()
