"""A golden snapshot of every method: a seeded 3-step run of each, reduced to what must not change
when code only moves (metrics, every transcript with its per-token overlays, the final weights).

    .venv/bin/python scripts/golden.py -o /tmp/golden.json                   # before a refactor
    .venv/bin/python scripts/golden.py --against /tmp/golden.json            # after each commit

``--against`` exits 1 and names each method and field that differs. Wall-clock fields (``time/*``,
``*_s``, throughput) are left out: they differ between any two runs. Everything else is compared
byte for byte (JSON of floats written with ``repr``), so a refactor that changes one rounding step
anywhere fails it. Takes ~1-2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 3


def _timing(key: str) -> bool:
    return key.startswith(("time/", "perf/", "throughput/")) or key.endswith(("_s", "/s", "per_s"))


def _overrides(method: str, out: Path) -> list[str]:
    return [
        f"algorithm.name={method}",
        f"run.output_dir={out}",
        "run.seed=7",
        "run.threads=1",
        f"trainer.total_steps={STEPS}",
        "algorithm.max_sampling_rounds=1",
        "trainer.lr=5e-4",  # large enough that each update changes what the next step samples
        "logging.tensorboard=false",
        "logging.plots=false",
    ]


def snapshot(method: str, work: Path) -> dict:
    """One method's seeded run, reduced to its comparable parts."""
    from agentrl.assembly import make_trainer
    from agentrl.config import load_config

    out = work / method
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", _overrides(method, out))
    make_trainer(cfg, log=lambda *_: None).train()
    metrics = [
        {k: v for k, v in json.loads(line).items() if not _timing(k)}
        for line in (out / "metrics.jsonl").read_text().split("\n")
        if line
    ]
    episodes = []
    for line in (out / "transcripts.jsonl").read_text().split("\n"):
        if line:
            episode = json.loads(line)
            episode.get("metrics", {}).pop("wall_s", None)
            episodes.append(episode)
    episodes.sort(key=lambda e: (e["step"], e["id"]))
    weights = sorted((out / "checkpoints").glob(f"step_{STEPS - 1}*/model.safetensors")) or sorted(
        (out / "checkpoints").glob("*/model.safetensors")
    )
    return {
        "metrics": metrics,
        "transcripts_sha256": hashlib.sha256(json.dumps(episodes, sort_keys=True).encode()).hexdigest(),
        "episodes": len(episodes),
        "weights_sha256": hashlib.sha256(weights[-1].read_bytes()).hexdigest(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-o", "--out", type=Path, help="write the snapshot here")
    parser.add_argument("--against", type=Path, help="compare with a snapshot written earlier")
    parser.add_argument("--methods", nargs="*", help="only these methods (default: every registered one)")
    args = parser.parse_args()
    from agentrl.algorithms.registry import METHODS

    methods = args.methods or sorted(METHODS)
    with tempfile.TemporaryDirectory() as tmp:
        snap = {m: snapshot(m, Path(tmp)) for m in methods}
    if args.out:
        args.out.write_text(json.dumps(snap, indent=1, sort_keys=True))
        print(f"golden snapshot of {len(snap)} methods written to {args.out}")
    if not args.against:
        return 0
    want = json.loads(args.against.read_text())
    differ = []
    for m in methods:
        if m not in want:
            differ.append(f"{m}: not in {args.against}")
            continue
        got = json.loads(json.dumps(snap[m], sort_keys=True))
        for field in sorted(set(got) | set(want[m])):
            if got.get(field) != want[m].get(field):
                differ.append(f"{m}: {field} differs")
    for line in differ:
        print(line)
    print(
        f"golden snapshot: {len(methods) - len({d.split(':')[0] for d in differ})} of {len(methods)} methods identical"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
