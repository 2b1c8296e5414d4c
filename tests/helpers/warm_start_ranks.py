"""The SFT warm start under torchrun, for tests/training/test_warm_start_ranks.py:

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/warm_start_ranks.py OUT_DIR MODEL

``build.run_sft`` is replaced by a stand-in that takes longer than the process group's timeout
(``COLLECTIVE_S``), copies the base model as its result and records which rank on which host ran it.
Three cases, one after another, each with a cache of its own:

- ``shared``: both ranks see one cache (one node, or a shared filesystem): rank 0 trains, once;
- ``node_local``: each rank on a host of its own (``socket.gethostname`` per rank) with a cache only
  it sees: rank 0 trains, rank 1 finds nothing and trains its node's copy;
- ``fails``: rank 0's warm start raises; rank 1 stops at once, naming it.

Rank 0 writes every rank's results to OUT_DIR/out.json."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from agentrl.assembly import build
from agentrl.config import load_config
from agentrl.parallel import ranks
from tests.helpers.configs import exit_driver

COLLECTIVE_S = 3.0
SFT_S = 4.5  # longer than COLLECTIVE_S


def main() -> None:
    out, model = Path(sys.argv[1]), sys.argv[2]
    rank, _ = ranks.init_from_env(timeout_s=COLLECTIVE_S)
    trained = out / "trained.log"
    fail = {"on": False}

    def fake_sft(cfg, base, tmp, log=print):
        if fail["on"]:
            raise RuntimeError("the demonstrations do not fit rollout.max_episode_tokens")
        time.sleep(SFT_S)
        shutil.copytree(base, tmp)
        with open(trained, "a") as f:
            f.write(f"{rank} {socket.gethostname()}\n")

    build.run_sft = fake_sft
    cfg = load_config(None, [f"model.path={model}", "sft.enabled=true", "run.device=cpu"])
    record: dict[str, dict] = {}
    real_host = socket.gethostname
    for case in ("shared", "node_local", "fails"):
        fail["on"] = case == "fails"
        cache = out / case / (f"rank{rank}" if case == "node_local" else "shared")
        os.environ["AGENTRL_CACHE"] = str(cache)
        socket.gethostname = (lambda: f"node{rank}") if case == "node_local" else real_host  # type: ignore[assignment]
        t0 = time.monotonic()
        try:
            path = build.policy_path(cfg, log=lambda _: None)
            record[case] = {"path": str(Path(path).relative_to(out)), "s": time.monotonic() - t0}
        except Exception as e:
            record[case] = {"error": type(e).__name__, "message": str(e)[:600], "s": time.monotonic() - t0}
        record[case]["left"] = sorted(p.name for p in cache.glob("warmstart/*"))
    record["trained"] = trained.read_text().split("\n") if trained.exists() else []
    parts = ranks.gather_to_rank0(record)
    if rank == 0:
        (out / "out.json").write_text(json.dumps(parts))
    ranks.leave()
    exit_driver()


if __name__ == "__main__":
    main()
