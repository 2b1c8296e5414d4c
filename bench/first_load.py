"""FSDP2's first load on W ranks: rank 0's broadcast against each rank reading its own shards.

    python -m torch.distributed.run --nproc_per_node 2 bench/first_load.py --preset h640-L12
    python -m torch.distributed.run --nproc_per_node 4 bench/first_load.py --preset h640-L12 --rounds 3
    python -m torch.distributed.run --nproc_per_node 3 bench/first_load.py --preset h128-L8 --layers 2 \
        --checkpoint-dtype bfloat16 --out OUT.json     # tests/parallel/test_first_load.py

A model of the tiny preset is saved (float32, or ``--checkpoint-dtype``), then loaded into FSDP2
(fp32 shards on the CPU, gloo, as under ``trainer.fsdp.cpu_offload``) two ways, in turn for
``--rounds`` rounds:

- ``broadcast`` (``sharding.materialize``): rank 0 reads the checkpoint into host memory, the other
  ranks build the model on the meta device, and torch's ``set_model_state_dict(broadcast_from_rank0)``
  sends every tensor whole from rank 0 to each other rank, one tensor at a time;
- ``per_rank`` (``shard_reads.read_own_shards``): every rank builds the model on meta and reads only
  its rows of each tensor from the safetensors file.

Both must give the same shards bit for bit (checked every round). Reported per method: the median
seconds from the start of the load to every rank's shards filled, and rank 0's bytes sent (the
broadcast sends (W - 1) copies of the model; the per-rank read sends nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.assembly.components import meta_model
from agentrl.config import TrainerConfig
from agentrl.models import build_tiny_model, load_policy, train_tokenizer
from agentrl.parallel import ranks, shard_reads, sharding


def load(method: str, path: str, strategy: sharding.Sharded) -> tuple[torch.nn.Module, float]:
    rank = strategy.rank
    dist.barrier()
    t0 = time.perf_counter()
    if method == "broadcast" and rank == 0:
        model = load_policy(path, dtype="float32")[0]
        full = model.state_dict()
    else:
        model, full = meta_model(path, "float32"), None
    strategy.prepare(model)
    sharding.materialize(model, torch.device("cpu"), full, broadcast=method == "broadcast")
    if method == "per_rank":
        shard_reads.read_own_shards(model, path)
    dist.barrier()
    return model, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h640-L12")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
    ap.add_argument("--checkpoint-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the results as JSON here (rank 0)")
    args = ap.parse_args()
    rank, world = ranks.init_from_env()
    strategy = sharding.make_strategy(
        TrainerConfig(strategy="fsdp2", bf16=False), rank, world, torch.device("cpu")
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "model")
        if rank == 0:
            kwargs = {"num_layers": args.layers} if args.layers else {}
            build_tiny_model(path, args.preset, tokenizer=train_tokenizer(), seed=0, **kwargs)
            if args.checkpoint_dtype == "bfloat16":
                model, _ = load_policy(path, dtype="bfloat16")
                model.save_pretrained(path)
        path = ranks.broadcast_from_rank0(path)
        dist.barrier()
        times: dict[str, list[float]] = {"broadcast": [], "per_rank": []}
        for r in range(args.rounds):
            order = ("broadcast", "per_rank") if r % 2 == 0 else ("per_rank", "broadcast")
            shards = {}
            for method in order:
                model, seconds = load(method, path, strategy)
                times[method].append(seconds)
                shards[method] = {n: p.to_local().clone() for n, p in model.named_parameters()}
            same = all(
                torch.equal(shards["broadcast"][n], shards["per_rank"][n]) for n in shards["broadcast"]
            )
            assert ranks.all_ranks(same), "the per-rank read and the broadcast gave different shards"
        n_bytes = sum(t.numel() * 4 for t in load_policy(path)[0].state_dict().values()) if rank == 0 else 0
    result = {
        "world": world,
        "model_bytes": n_bytes,
        "same_shards": True,
        **{f"{m}_s": statistics.median(v) for m, v in times.items()},
        "broadcast_sent_bytes": n_bytes * (world - 1),
    }
    if rank == 0:
        print(json.dumps(result, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(result))
    ranks.leave()


if __name__ == "__main__":
    main()
