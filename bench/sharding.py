"""DDP against FSDP2 (and LoRA against full fine-tuning) on 2 CPU ranks: learner step time and the
per-rank memory of parameters, gradients and AdamW states.

    .venv/bin/python bench/sharding.py --rounds 2 --steps 2

Each configuration is one ``torchrun --nproc_per_node 2`` launch (gloo, 1 thread per rank) that
builds the learner through ``Trainer`` (the training path: loading, LoRA, sharding), then times
``--steps`` updates (after one warm-up update) of the tiny ``h640-L12`` Qwen2 (60.3 M parameters)
on the same seeded batch: 8 episodes of a 24-token prompt and a 232-token reply, 2 mini-batches,
micro-batches of 2 rows, fp32. Memory is counted, not sampled: the bytes of the tensors this rank
holds for parameters, gradients and optimizer states (for FSDP2, its shards). The configurations run
in rotated order for ``--rounds`` rounds; reported are medians and the per-round ratios to DDP (the
machine's speed drifts between launches).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "ddp": ["trainer.strategy=ddp"],
    "fsdp2": ["trainer.strategy=fsdp2"],
    "fsdp2-keep": ["trainer.strategy=fsdp2", "trainer.fsdp.reshard_after_forward=false"],
    "ddp+lora": ["trainer.strategy=ddp", "model.lora.rank=16", "model.lora.alpha=32"],
    "fsdp2+lora": ["trainer.strategy=fsdp2", "model.lora.rank=16", "model.lora.alpha=32"],
}


def local_bytes(t) -> int:
    """Bytes this rank holds for ``t`` (a DTensor's local shard, or the tensor)."""
    t = getattr(t, "_local_tensor", t)
    return t.numel() * t.element_size()


def worker(out: str, model_dir: str, steps: int, overrides: list[str]) -> None:
    import torch

    from agentrl.assembly import make_trainer
    from agentrl.config import load_config
    from agentrl.episode import Segment
    from tests.helpers.batches import synthetic_batch

    run_dir = tempfile.mkdtemp(prefix="bench_sharding_")
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.output_dir={run_dir}",
            "run.device=cpu",
            "trainer.micro_batch_size=2",
            "trainer.mini_batches_per_step=2",
            "logging.tensorboard=false",
            "logging.plots=false",
            *overrides,
        ],
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    learner = trainer.learner
    g = torch.Generator().manual_seed(0)
    eps = synthetic_batch(1024, n=8).episodes
    for i, ep in enumerate(eps):  # one long reply per episode: 24 + 232 = 256 tokens
        ep.segments = ep.segments[:1]
        ep.segments[0].token_ids = torch.randint(5, 1024, (24,), generator=g).tolist()
        reply = torch.randint(5, 1024, (232,), generator=g).tolist()
        ep.add(Segment("policy", 0, reply, "a", [-1.0] * len(reply), 0))
        ep.reward = float(i % 3) / 2
    batch = learner.make_batch(eps)
    times = []
    for step in range(steps + 1):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        learner.update(batch, step)
        torch.distributed.barrier()
        times.append(time.perf_counter() - t0)
    params = list(learner.model.parameters())
    memory = {
        "parameters": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(
            local_bytes(v)
            for s in learner.optimizer.state.values()
            for v in s.values()
            if torch.is_tensor(v) and v.dim()
        ),
    }
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    if trainer.rank == 0:
        Path(out).write_text(
            json.dumps({"step_s": times[1:], "memory": memory, "trainable_local": trainable})
        )
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(name: str, model_dir: Path, steps: int, tmp: Path) -> dict:
    out = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, "--worker", str(out)]
    cmd += ["--model", str(model_dir), "--steps", str(steps), *CONFIGS[name]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=list(CONFIGS), help="run these configurations (ddp always)")
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_intermixed_args()
    if args.worker:
        return worker(args.worker, args.model, args.steps, args.overrides)

    from agentrl.models import build_tiny_model, train_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="bench_sharding_"))
    model_dir = build_tiny_model(tmp / "h640-L12", "h640-L12", tokenizer=train_tokenizer(), seed=0)
    names = ["ddp", *[n for n in args.only if n != "ddp"]] if args.only else list(CONFIGS)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            res = launch(name, model_dir, args.steps, tmp)
            results[name].append(res)
            print(f"round {r}: {name:11s} {statistics.median(res['step_s']):6.2f} s/step", flush=True)
    print(f"\n2 ranks (gloo), h640-L12 (60.3 M), fp32; median over {args.rounds} rounds × {args.steps} steps")
    print(
        f"{'':12s} {'s/step':>7s} {'× ddp':>6s}  {'params MiB':>10s} {'grads MiB':>9s} {'AdamW MiB':>9s} {'total':>7s} {'× ddp':>6s}"
    )
    mib = 2**20
    base_time = [statistics.median(x["step_s"]) for x in results["ddp"]]
    base_mem = sum(results["ddp"][0]["memory"].values())
    for name in names:
        times = [statistics.median(x["step_s"]) for x in results[name]]
        ratios = [t / b for t, b in zip(times, base_time)]
        m = results[name][0]["memory"]
        total = sum(m.values())
        print(
            f"{name:12s} {statistics.median(times):7.2f} {statistics.median(ratios):6.2f}  "
            f"{m['parameters'] / mib:10.1f} {m['gradients'] / mib:9.1f} {m['optimizer'] / mib:9.1f} "
            f"{total / mib:7.1f} {total / base_mem:6.2f}   per-round time ratios {[round(x, 2) for x in ratios]}"
        )


if __name__ == "__main__":
    main()
