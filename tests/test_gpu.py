"""The GPU check (``bash scripts/gpu_check.sh``): the trainer, the HF engine, FSDP2 and LoRA on CUDA,
engine/trainer log-prob parity there, ``agentrl plan`` against ``torch.cuda.max_memory_allocated``, a
Ray rollout worker sharing the GPU with the trainer and taking its weights over CUDA IPC,
``run.deterministic`` repeating a run bit for bit, and the decode step's CUDA graphs kept across
batches and weight syncs.

Marked ``gpu``; each test skips, saying why, when torch sees no CUDA device (CI machines have none).
Models are built locally: the GPU machine reaches no hub.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from tests.helpers import HELPERS
from tests.helpers.jsonl import lines

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
]
ENVS = HELPERS / "distributed_envs.py"


def overrides(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"model.path={model_dir}",
        "env.name=test_crashy",
        f"env.module={ENVS}",
        f"run.output_dir={out}",
        "run.device=cuda",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_tokens_per_turn=16",
        "rollout.max_episode_tokens=96",
        "trainer.total_steps=3",
        "trainer.micro_batch_size=4",
        "trainer.lr=1e-3",
        "logging.tensorboard=false",
        "logging.plots=false",
        *extra,
    ]


def train(model_dir: Path, out: Path, *extra: str):
    from agentrl.assembly import make_trainer

    trainer = make_trainer(load_config(None, overrides(model_dir, out, *extra)), log=print)
    before = {
        n: p.detach().float().cpu().clone()
        for n, p in trainer.learner.strategy.full_parameters(trainer.model)
    }
    trainer.train()
    after = {
        n: p.detach().float().cpu().clone()
        for n, p in trainer.learner.strategy.full_parameters(trainer.model)
    }
    rows = [json.loads(x) for x in lines(out / "metrics.jsonl")]
    return trainer, before, after, rows


def changed(before: dict, after: dict) -> list[str]:
    return [n for n in before if not torch.equal(before[n], after[n])]


def test_rl_steps_on_cuda_with_bf16_mixed_precision(tmp_path, tiny_model_dir):
    trainer, before, after, rows = train(
        tiny_model_dir, tmp_path / "run", "trainer.bf16=true", "rollout.dtype=bfloat16"
    )
    assert next(trainer.model.parameters()).device.type == "cuda"
    assert next(trainer.engine.model.parameters()).dtype == torch.bfloat16
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(math.isfinite(r["grad/norm"]) and r["grad/norm"] > 0 for r in rows)
    assert len(changed(before, after)) == len(before)
    assert all(r["mismatch/abs_logp_mean"] < 0.05 for r in rows)  # bf16 engine vs autocast trainer


def test_fsdp2_on_one_gpu(tmp_path, tiny_model_dir):
    _, before, after, rows = train(
        tiny_model_dir, tmp_path / "run", "trainer.strategy=fsdp2", "trainer.bf16=true"
    )
    assert all(math.isfinite(r["grad/norm"]) for r in rows) and len(changed(before, after)) == len(before)
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_3" / "trainer_state.pt", weights_only=False)
    assert state["weights"]["format"] == "dcp"


def test_lora_on_cuda_trains_only_the_adapters(tmp_path, tiny_model_dir):
    _, before, after, rows = train(tiny_model_dir, tmp_path / "run", "model.lora.rank=8", "trainer.bf16=true")
    assert all(math.isfinite(r["grad/norm"]) for r in rows)
    moved = changed(before, after)
    assert moved and all("lora_" in n for n in moved)
    assert (tmp_path / "run" / "checkpoints" / "step_3" / "adapter" / "adapter_config.json").exists()


def test_engine_logprobs_equal_the_trainers_on_cuda(tmp_path, tiny_model_dir):
    """fp32 on CUDA (TF32 off): the log-probs the HF engine reports while sampling equal the
    trainer's teacher-forced ones within 1e-4, after an update has been pushed to the engine."""
    from agentrl.engines.base import SamplingParams

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    trainer, *_ = train(tiny_model_dir, tmp_path / "run", "trainer.total_steps=1")
    prompts = [[5, 17, 40, 9], [11, 3, 250, 7, 60, 2]]
    outs = trainer.engine.generate(prompts, SamplingParams(max_tokens=24, temperature=1.0, seed=1))
    worst = 0.0
    with torch.no_grad():
        for prompt, out in zip(prompts, outs):
            ids = torch.tensor([prompt + out.token_ids], device="cuda")
            logits = trainer.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            ref = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0].cpu()
            worst = max(worst, float((ref - torch.tensor(out.logprobs)).abs().max()))
    print(f"engine/trainer max |Δ logp| on CUDA: {worst:.2e}")
    assert worst <= 1e-4


def test_kept_cuda_graphs_survive_a_second_batch_and_a_weight_sync(peaky_policy):
    """fp32 on CUDA (TF32 off): the decode step's graphs (engines/decode_graphs.py) are captured once
    per batch bucket; a second batch and a batch after ``load_weights`` replay them, and every batch's
    tokens equal the eager lean loop's on the same weights (log-probs within 1e-5). The first batch's
    2-row arena is replaced by the next one's 8 rows, whose graphs go into a new memory pool (under
    one engine-wide pool, that capture failed PyTorch's allocator assert on an H200)."""
    import copy

    from agentrl.engines.decode_graphs import GraphPool
    from agentrl.engines.decode_loop import StepGraph
    from agentrl.engines.hf import HFEngine
    from tests.helpers.decode_cases import mixed_requests, same

    torch.backends.cuda.matmul.allow_tf32 = False
    model, tok = peaky_policy
    captures = []

    def counted(fn, device, pool):
        captures.append(fn.args[0].logits.shape[0])
        return StepGraph(fn, device, pool)

    kept = HFEngine(copy.deepcopy(model), tok, device="cuda", lean_decode=True)
    kept._graphs = GraphPool(capture=counted)
    eager = HFEngine(copy.deepcopy(model), tok, device="cuda", lean_decode=True, cuda_graphs=False)
    prompts, params = mixed_requests(tok)
    same(kept.generate(prompts[:2], params[:2]), eager.generate(prompts[:2], params[:2]))
    small = kept._graphs.arenas[0].pool
    same(kept.generate(prompts, params), eager.generate(prompts, params))
    assert [(a.rows, a.pool != small) for a in kept._graphs.arenas] == [(8, True)]
    first = list(captures)
    same(kept.generate(prompts, params), eager.generate(prompts, params))
    new = {
        n: p + 0.05 * torch.randn_like(p) for n, p in model.state_dict().items() if n.endswith("proj.weight")
    }
    kept.load_weights(new)
    eager.load_weights(new)
    same(kept.generate(prompts, params), eager.generate(prompts, params))
    print(f"buckets captured: {first}; after a second batch and a weight sync: {captures}")
    assert captures == first and len(first) > 1


def long_episodes(n: int, policy_tokens: int) -> list:
    """``n`` episodes of a 24-token prompt and one long policy reply, in one group, rewards 0 and 1."""
    from agentrl.episode import Episode, Segment

    g = torch.Generator().manual_seed(0)
    eps = []
    for i in range(n):
        ep = Episode(id=f"e{i}", env="synthetic", task_id="t", seed=i, group="g")
        ep.add(Segment("prompt", 0, torch.randint(5, 1024, (24,), generator=g).tolist(), "p"))
        reply = torch.randint(5, 1024, (policy_tokens,), generator=g).tolist()
        ep.add(Segment("policy", 0, reply, "a", [-1.0] * policy_tokens, 0))
        ep.reward = float(i % 2)
        eps.append(ep)
    return eps


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_plan_matches_the_peak_memory_of_an_update(tmp_path, strategy):
    """A 60 M model at 2 × 1024 tokens: the planner's training terms (weights, gradients, AdamW,
    gathered parameters, activations, logits) against the peak CUDA memory of the second update,
    within 35% (allocator rounding and transient workspaces are not modelled). The first update is
    not the steady state: AdamW creates its moments in its first step, after the backward pass has
    freed the activations (on an H100, 2026-11-27, FSDP2's first update peaked at 0.56x the plan)."""
    from agentrl.assembly import make_trainer
    from agentrl.models import build_tiny_model, train_tokenizer
    from agentrl.plan import plan

    model_dir = build_tiny_model(tmp_path / "m60", "h640-L12", tokenizer=train_tokenizer(), seed=0)
    extra = [f"trainer.strategy={strategy}", "trainer.bf16=true", "model.gradient_checkpointing=false"]
    extra += [
        "rollout.max_episode_tokens=1024",
        "rollout.max_tokens_per_turn=512",
        "trainer.micro_batch_size=2",
    ]
    cfg = load_config(None, overrides(model_dir, tmp_path / "run", *extra))
    trainable = (
        "policy weights",
        "gradients",
        "AdamW",
        "gathered",
        "unsharded",
        "bf16 weight",
        "activations",
        "logits",
    )
    estimate = sum(t.bytes for t in plan(cfg, gpus=1).terms if t.name.startswith(trainable))
    trainer = make_trainer(cfg, log=print)
    learner = trainer.learner
    episodes = long_episodes(n=2, policy_tokens=1000)
    torch.cuda.synchronize()
    engine_bytes = sum(p.numel() * p.element_size() for p in trainer.engine.model.parameters())
    engine_bytes = engine_bytes if trainer.engine.model is not trainer.model else 0
    learner.update(learner.make_batch(episodes), 0)  # creates AdamW's moments, which then stay
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    learner.update(learner.make_batch(episodes), 1)  # the steady state the plan describes
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - engine_bytes
    print(
        f"{strategy}: plan {estimate / 2**30:.3f} GiB, measured peak {peak / 2**30:.3f} GiB ({peak / estimate:.2f}x)"
    )
    assert peak == pytest.approx(estimate, rel=0.35)


def test_a_ray_worker_sharing_the_gpu_takes_its_weights_over_cuda_ipc(tmp_path, tiny_model_dir):
    """The scale path on one GPU: the trainer and one Ray rollout worker share it
    (``rollout.worker_gpus=0.5``: a local Ray is given the trainer's own GPU, the only one), the
    worker's HF engine binds to it, each update reaches the worker through CUDA IPC handles to the
    trainer's GPU memory, and every sync is verified (checksums and probe) in the worker."""
    pytest.importorskip("ray", reason="ray is not installed here (the GPU machine has none: docs/scaling.md)")
    import ray

    from agentrl.assembly import make_trainer

    extra = ("rollout.workers=1", "rollout.worker_gpus=0.5", "rollout.sync.transport=cuda_ipc")
    trainer = make_trainer(load_config(None, overrides(tiny_model_dir, tmp_path / "run", *extra)), log=print)
    pool = trainer.engine
    try:
        (given,) = pool.placements()
        print(f"worker placement: {given}")
        mine = str(torch.cuda.get_device_properties(0).uuid)
        assert given["engine_device"].startswith("cuda") and given["ray_gpu_ids"] == [given["cuda_0_is_gpu"]]
        assert ray.get(pool.workers[0].gpu_uuid.remote()) == mine  # the trainer's GPU
        for step in range(2):
            out = trainer.train_step(step)
            print({k: v for k, v in out.metrics.items() if k.startswith(("sync/", "time/sync"))})
            assert out.metrics["sync/verified"] == 1.0 and out.metrics["sync/probe_max_abs_diff"] < 1e-3
        assert pool.version == 2
    finally:
        pool.shutdown()
        ray.shutdown()


PER_PROCESS = ("tokens/s", "reward/pid")
"""Metrics no seed fixes: a rate (wall-clock) and test_crashy's process id (a zero-weight reward)."""


@pytest.mark.slow  # three trainings in processes of their own: about a minute on an H200
def test_deterministic_mode_repeats_a_run_bit_for_bit(tmp_path, tiny_model_dir):
    """``run.deterministic=true`` on CUDA, each run in a process of its own without
    CUBLAS_WORKSPACE_CONFIG (this one's CUDA has started): the trainer sets it before CUDA starts, and
    two runs with the same seed end with the same metrics and the same weights. A third run without
    the mode gives the cost (printed)."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    runs = {"a": "true", "b": "true", "plain": "false"}
    for name, on in runs.items():
        cmd = [sys.executable, "-m", "agentrl.cli", "train", *overrides(tiny_model_dir, tmp_path / name)]
        cmd += [f"run.deterministic={on}", "trainer.bf16=true", "trainer.checkpoint_every=3"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {n: [json.loads(x) for x in lines(tmp_path / n / "metrics.jsonl")] for n in runs}
    differ = [
        (ra["step"], k, ra[k], rb.get(k))
        for ra, rb in zip(rows["a"], rows["b"], strict=True)
        for k in ra
        if not k.startswith("time/") and k not in PER_PROCESS and ra[k] != rb.get(k)
    ]
    assert not differ, f"(step, metric, run a, run b): {differ[:10]}"
    weights = [(tmp_path / n / "checkpoints" / "step_3" / "model.safetensors").read_bytes() for n in "ab"]
    assert weights[0] == weights[1]
    step_s = {n: sum(r["time/step_s"] for r in rows[n][1:]) / 2 for n in runs}
    print(f"step time after the first, deterministic vs not: {step_s['a']:.3f} s vs {step_s['plain']:.3f} s")


# -- the multi-GPU path's parts one GPU can show (docs/scaling.md; the rest: scripts/gpu_check_multi.sh)
def test_the_nccl_weight_group_broadcasts_on_one_rank():
    """``rollout.sync.transport=broadcast``'s NCCL branch (sync/weight_group.py), a group of one
    rank, which is all one GPU allows (NCCL refuses two ranks on one device): the constructor with
    its Options' timeout, the eager connect on the device, a bucket of two dtypes broadcast as flat
    buffers, and the abort that ends it."""
    from agentrl.sync import weight_group

    device = torch.device("cuda", 0)
    store = weight_group.host_store("127.0.0.1", 1, 60.0)
    group = weight_group.make_group(store, 0, 1, device, 60.0)
    bucket = [
        ("a", torch.arange(12, dtype=torch.float32, device=device).view(3, 4)),
        ("b", torch.ones(5, dtype=torch.bfloat16, device=device)),
        ("c", torch.full((2, 2), 7.0, device=device)),
    ]
    want = [t.clone() for _, t in bucket]
    weight_group.send_bucket(group, bucket, device, 60.0)
    torch.cuda.synchronize()
    assert all(torch.equal(t, w) for (_, t), w in zip(bucket, want))
    weight_group.leave(group)


def test_fsdp2_with_pinned_cpu_offload_trains_checkpoints_and_resumes(tmp_path, tiny_model_dir):
    """The 32 B config's layout on one GPU: FSDP2 with ``cpu_offload`` (pinned host shards, the
    optimizer on the host), two steps with a DCP checkpoint after each, then a resume for a third.
    On the CPU the offload runs unpinned (tests/parallel/test_ddp.py); only here is it pinned."""
    from agentrl.assembly import make_trainer

    extra = ("trainer.strategy=fsdp2", "trainer.fsdp.cpu_offload=true", "trainer.bf16=true")
    run = tmp_path / "run"
    cfg = load_config(
        None, overrides(tiny_model_dir, run, *extra, "trainer.total_steps=2", "trainer.checkpoint_every=1")
    )
    trainer = make_trainer(cfg, log=print)
    local = [p.to_local() for p in trainer.model.parameters()]
    assert all(t.device.type == "cpu" and t.is_pinned() for t in local)
    rows = trainer.train()
    assert len(rows) == 2 and all(math.isfinite(r["grad/norm"]) for r in rows)
    resumed = make_trainer(
        load_config(
            None, [*overrides(tiny_model_dir, run, *extra), "trainer.total_steps=3", "run.resume=true"]
        ),
        log=print,
    )
    assert resumed.start_step == 2
    assert len(resumed.train()) == 1


def test_the_kl_reference_under_fsdp2_holds_what_the_plan_counts(tmp_path):
    """The reference loads on the host and its shards go to the GPU (training/policy_setup.py): on
    one rank its GPU bytes are the plan's "KL reference weights" term, and building it raises the
    GPU's peak by no more than that (a whole extra copy on the GPU first would double it)."""
    from agentrl.assembly.build import reference_model
    from agentrl.models import build_tiny_model, train_tokenizer
    from agentrl.parallel import sharding
    from agentrl.plan import plan

    model_dir = build_tiny_model(tmp_path / "m60", "h640-L12", tokenizer=train_tokenizer(), seed=0)
    cfg = load_config(
        None, overrides(model_dir, tmp_path / "run", "trainer.strategy=fsdp2", "algorithm.kl_coef=0.01")
    )
    term = next(t.bytes for t in plan(cfg, gpus=1).terms if t.name == "KL reference weights")
    strategy = sharding.make_strategy(
        dataclasses.replace(cfg.trainer, bf16=False), 0, 1, torch.device("cuda", 0)
    )
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ref = reference_model(cfg, strategy, torch.device("cuda", 0), log=print)
    torch.cuda.synchronize()
    held = sum(p.to_local().numel() * p.to_local().element_size() for p in ref.parameters())
    rise = torch.cuda.max_memory_allocated() - before
    print(
        f"KL reference: plan {term / 2**20:.1f} MiB, held {held / 2**20:.1f} MiB, peak rise {rise / 2**20:.1f} MiB"
    )
    assert held == pytest.approx(term, rel=0.01)
    assert rise <= 1.25 * term  # the shards, and one layer whole while it is sharded


def test_async_runner_and_async_trainer_threads_on_cuda(tmp_path, tiny_model_dir):
    """Every helper thread (the request batcher, the pipeline's batch threads, the weight sync's)
    starts on the process's device (timeouts.start_thread): on one GPU that is device 0 either way,
    so this shows the threads' real CUDA calls work; which device on rank r > 0 is
    tests/core/test_thread_devices.py's (a fake) and gpu_check_multi.sh's (two GPUs)."""
    _, before, after, rows = train(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.runner=async",
        "trainer.mode=async",
        "rollout.max_staleness=1",
        "algorithm.is_correction=tis",
        "trainer.total_steps=2",
    )
    assert len(rows) == 2 and changed(before, after)
