"""Data-parallel training: 2 gloo processes launched by torchrun give the single-process gradient."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.ddp import selfcheck_gradient, shard_rows
from agentrl.models import load_policy


def test_shards_cover_rows_once():
    assert [shard_rows(5, r, 2).tolist() for r in range(2)] == [[0, 1], [2, 3, 4]]
    assert [len(shard_rows(7, r, 3)) for r in range(3)] == [2, 2, 3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_gloo_gradient_equals_single_process(tmp_path, tiny_model_dir):
    assert "RANK" not in os.environ
    model, _ = load_policy(tiny_model_dir)
    model.train()
    single = selfcheck_gradient(model, micro_batch_size=2)
    # accumulation is exact too: one micro-batch of 6 rows gives the same gradient as three of 2
    whole = selfcheck_gradient(model, micro_batch_size=6)
    for n, g in single.items():
        torch.testing.assert_close(whole[n], g, rtol=1e-4, atol=1e-7)

    out = tmp_path / "grads.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}", "-m", "agentrl.ddp"]
    cmd += ["--selfcheck", str(tiny_model_dir), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = torch.load(out)
    assert saved["world"] == 2
    ddp = saved["grads"]
    assert set(ddp) == set(single) and len(single) > 10
    biggest = max(float(g.abs().max()) for g in single.values())
    assert biggest > 1e-4  # a real gradient: a missing ×W (or a lost shard) would be far off
    for n, g in single.items():
        torch.testing.assert_close(ddp[n], g, rtol=1e-4, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")


def _overrides(out: Path, model_dir: Path) -> list[str]:
    envs = Path(__file__).parent / "distributed_envs.py"
    return [
        f"model.path={model_dir}",
        "env.name=test_crashy",
        f"env.module={envs}",
        f"run.output_dir={out}",
        "run.device=cpu",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens_per_turn=8",
        "rollout.max_episode_tokens=64",
        "trainer.total_steps=1",
        "trainer.micro_batch_size=1",  # 2 micro-batches per rank: exercises the single all-reduce
        "trainer.lr=1e-3",
        "trainer.weight_decay=0.0",
        "logging.tensorboard=false",
        "logging.plots=false",
    ]


@pytest.mark.slow
def test_torchrun_trainer_step_equals_single_process(tmp_path, tiny_model_dir):
    """One RL step under torchrun with 2 gloo ranks (rollouts sharded, gradients all-reduced) against
    the same step in one process: same episodes, same gradient norm, same weights after AdamW."""
    from safetensors.torch import load_file

    from agentrl.config import load_config
    from agentrl.trainer import Trainer

    single = tmp_path / "single"
    Trainer(load_config(None, _overrides(single, tiny_model_dir)), log=lambda *_: None).train()

    dp = tmp_path / "dp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}", "-m", "agentrl.cli", "train"]
    proc = subprocess.run(
        cmd + _overrides(dp, tiny_model_dir), env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = [json.loads((d / "metrics.jsonl").read_text().splitlines()[0]) for d in (single, dp)]
    assert rows[0]["reward/mean"] == pytest.approx(rows[1]["reward/mean"], abs=1e-9)  # same episodes
    assert rows[0]["length/policy_tokens_total"] == rows[1]["length/policy_tokens_total"]
    assert rows[0]["grad/norm"] > 1e-3
    assert rows[1]["grad/norm"] == pytest.approx(rows[0]["grad/norm"], rel=1e-4)  # the gradients agree
    ckpt = "checkpoints/step_1/model.safetensors"
    a, b = load_file(single / ckpt), load_file(dp / ckpt)
    rank1 = json.loads((dp / "ranks" / "1" / "metrics.jsonl").read_text().splitlines()[0])
    assert rank1["grad/norm"] == rows[1]["grad/norm"]  # both ranks stepped with the same gradient
    # AdamW's first step is lr·g/(|g|+ε) ≈ ±lr per weight: only weights whose gradient is ~0 (sign
    # decided by rounding) may differ, by at most 2·lr
    diff = torch.cat([(a[n] - b[n]).abs().flatten() for n in a])
    assert float(diff.max()) <= 2.0e-3 + 1e-6
    assert float((diff > 1e-6).float().mean()) < 0.01
