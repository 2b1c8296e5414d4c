"""``agentrl plan``: parameter counts and every memory term against hand-computed values, each
budget (a colocated vLLM engine's share, the trainer's rest) checked on its own, the activation
formula against the tensors autograd actually saves, and configs/gpu fitting the hardware their
comments name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.models.checkpointing import checkpointing as enable_checkpointing
from agentrl.plan import CHUNK_COPIES, GIB, architecture, plan, render, sizes
from tests.helpers import ROOT
from tests.helpers.configs import header_plans

# tiny:h128-L8: hidden 128, 8 layers, 4 heads (head_dim 32), 2 KV heads (kv width 64), MLP 448, vocab 1024
H, L, MLP, HEADS, KV, V = 128, 8, 448, 4, 64, 1024
LAYER = (
    (H * H + H) + 2 * (H * KV + KV) + H * H + 3 * H * MLP + 2 * H
)  # q(+bias), k, v(+bias), o, MLP, 2 norms
N = V * H + L * LAYER + H + V * H  # embeddings, layers, final norm, untied head
PACKED = L * (LAYER + (HEADS + 2) * 32 * H) + V * H  # the lean step's: rotated q and k columns, its head


def sampling_state(rows: int, columns: int, e: int, arenas: int = 2) -> float:
    """What the CUDA graph arenas hold beside the KV cache: each arena's float32 logits [R, V]; per
    column, its float64 draws, int64 tokens, float32 log-probs and an attention bias per KV head (the
    second arena of half the columns)."""
    return arenas * rows * V * 4 + (1 + 0.5 * (arenas - 1)) * rows * columns * (20 + 2 * e)


def terms(p) -> dict[str, float]:
    return {t.name: t.bytes for t in p.terms}


def test_counts_the_architecture_exactly():
    a = architecture(load_config(None, ["model.path=tiny:h128-L8"]))
    assert (
        (a.params, a.layer_params, a.root_params)
        == (N, LAYER, N - L * LAYER)
        == (2_035_840, 221_696, 262_272)
    )
    assert (a.layers, a.hidden, a.kv_dim, a.intermediate, a.vocab, a.largest_tensor) == (
        L,
        H,
        KV,
        MLP,
        V,
        V * H,
    )
    lora = architecture(load_config(None, ["model.path=tiny:h128-L8", "model.lora.rank=8"]))
    per_layer = (H + H) + (H + KV) * 2 + (H + H) + (H + MLP) * 2 + (MLP + H)  # r·(in + out) per target
    assert lora.lora_params == 8 * L * per_layer == 167_936


def test_single_gpu_full_fine_tune_term_by_term():
    cfg = load_config(
        None,
        [
            "model.path=tiny:h128-L8",
            "rollout.max_episode_tokens=256",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_concurrent_episodes=8",
            "trainer.micro_batch_size=2",
        ],
    )
    p = plan(cfg, gpus=1, gpu_memory_gib=1.0)
    t = 2 * 256  # tokens per micro-batch
    per_token_layer = 16 * H + 4 * (4 * H + 2 * KV + 4 * MLP) + 4 * HEADS
    want = {
        "policy weights (float32)": 4 * N,
        "gradients": 4 * N,
        "AdamW moments": 8 * N,
        "activations (one micro-batch)": t * L * per_token_layer,
        "logits and their gradient": t * V * 8,
        "HF engine weights (float32)": 4 * N,
        "HF engine packed weights (lean step)": 4 * PACKED,
        # min(8 concurrent, 16 episodes) sequences of 256 columns, two arenas (the second of 128)
        "HF engine KV cache (CUDA graph arenas)": 1.5 * 8 * 256 * L * 2 * KV * 4,
        "HF engine sampling state (CUDA graph arenas)": sampling_state(8, 256, 4),
        "weight sync (streamed)": V * H * 4,
        # 16 episodes of up to 256 tokens, 31 bytes each: ids 8, mask 4, engine log-prob 4, 3 flags,
        # π_old's log-prob and entropy 8, token weight 4
        "the step's batch (every rank holds all of it)": 16 * 256 * 31,
        "CUDA context, NCCL, allocator slack": 2 * GIB,
    }
    assert terms(p) == pytest.approx(want)
    assert p.total_gib == pytest.approx(sum(want.values()) / GIB)
    assert p.fits == (sum(want.values()) <= GIB)


def test_the_packed_weights_term_is_what_the_lean_step_keeps():
    """The planner's packed-weights formula (``PACKED`` above, what the plans are checked against) is
    within 0.5 % of what ``PackedWeights`` holds for the tiny model: the formula counts the layer's
    norms, which are folded in, and not the rotated biases, a few hundred values a layer. The rotation
    folded into the q/k GEMM, as a CUDA engine packs it (the plan is for GPUs)."""
    from agentrl.engines.lean_weights import PackedWeights
    from agentrl.models import ensure_tiny_base, load_policy

    model, _ = load_policy(ensure_tiny_base())
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (H, L)
    packed = PackedWeights(model, fold_rotation=True)
    gemms = [g for layer in packed.layers for g in layer.gemms()] + [packed.head]
    held = sum(t.numel() for g in gemms for t in (g.w_t, g.bias) if t is not None)
    assert held == pytest.approx(PACKED, rel=5e-3)


def test_the_sampling_state_term_is_what_an_arena_holds():
    """Per arena, the planner's sampling-state formula is what ``decode_graphs._Arena`` allocates beside
    its KV buffers, within 1 %: the formula leaves out the per-row scalars (limits, stop ids, sampling
    settings: 65 bytes a row)."""
    from agentrl.engines.decode_graphs import _Arena
    from agentrl.engines.lean_weights import PackedWeights
    from agentrl.models import ensure_tiny_base, load_policy

    model, _ = load_policy(ensure_tiny_base())
    with torch.inference_mode():
        arena = _Arena(model, PackedWeights(model), rows=8, columns=128, stops=4, pool=None)
    state = [t for t in vars(arena.state).values() if isinstance(t, torch.Tensor)]
    held = sum(t.numel() * t.element_size() for t in [*state, arena.lean.bias])
    assert held == pytest.approx(sampling_state(8, 128, 4, arenas=1), rel=1e-2)


HSDP_LORA = [
    "model.path=tiny:h128-L8",
    "model.lora.rank=8",
    "model.gradient_checkpointing=true",
    "rollout.max_episode_tokens=128",
    "rollout.max_tokens_per_turn=64",
    "rollout.prompts_per_step=8",
    "rollout.group_size=4",
    "rollout.dtype=bfloat16",
    "trainer.strategy=fsdp2",
    "trainer.fsdp.replicas=2",
    "trainer.bf16=true",
    "trainer.micro_batch_size=1",
    "algorithm.kl_coef=0.01",
]


def test_hsdp_lora_bf16_checkpointed_term_by_term():
    """2 nodes × 4 GPUs, 2 replicas of 4-way shards; LoRA r=8 (fp32 adapters), FSDP2's bf16 mixed
    precision, gradient checkpointing, 4 micro-batches per reduction; the KL reference is the base
    model itself (no extra weights)."""
    cfg = load_config(None, HSDP_LORA)
    p = plan(cfg, gpus=4, nodes=2, gpu_memory_gib=80)
    P, t = 167_936, 128
    per_token_layer = 16 * H + 2 * (4 * H + 2 * KV + 4 * MLP) + 4 * HEADS
    want = {
        "policy weights (float32, 1/4)": 4 * N / 4,
        "gradients (1/4)": 4 * P / 4,
        "AdamW moments (1/4)": 8 * P / 4,
        "gathered parameters (FSDP2)": (2 * LAYER + N - L * LAYER) * 2,
        "unsharded gradient accumulation": 4 * P,  # 32 episodes / 8 ranks = 4 rows, 4 micro-batches
        "activations (one micro-batch)": t * (L * 2 * H + per_token_layer),
        "logits and their gradient": t * V * 4,
        "HF engine weights (bfloat16)": 2 * N,
        "HF engine packed weights (lean step)": 2 * PACKED,
        "HF engine KV cache (CUDA graph arenas)": 1.5 * 4 * 128 * L * 2 * KV * 2,  # 4 episodes per rank
        "HF engine sampling state (CUDA graph arenas)": sampling_state(4, 128, 2),
        "weight sync (streamed)": V * H * 2,
        "the step's batch (every rank holds all of it)": 32 * 128 * (31 + 4),  # + the reference's log-probs
        "CUDA context, NCCL, allocator slack": 2 * GIB,
    }
    assert terms(p) == pytest.approx(want)
    assert "HSDP 2 × 4" in p.layout and "LoRA" in p.layout and p.fits
    eager = plan(load_config(None, [*HSDP_LORA, "trainer.fsdp.grad_reduce=micro_batch"]), gpus=4, nodes=2)
    assert "unsharded gradient accumulation" not in terms(eager)


def test_cpu_offload_moves_the_states_to_the_host_and_bad_meshes_are_refused():
    base = ["model.path=tiny:h128-L8", "trainer.strategy=fsdp2"]
    p = plan(load_config(None, [*base, "trainer.fsdp.cpu_offload=true"]), gpus=2)
    assert not any(n.startswith(("policy weights", "gradients", "AdamW")) for n in terms(p))
    host = {t.name: t.bytes for t in p.host}
    assert host["AdamW moments (1/2) [offloaded]"] == pytest.approx(8 * N / 2 * 2)  # both ranks' shards
    with pytest.raises(ConfigError, match=r"replicas=3 does not divide the world size 4.*\[1, 2, 4\]"):
        plan(load_config(None, [*base, "trainer.fsdp.replicas=3"]), gpus=4)


# -- budgets: a colocated vLLM engine's share of the GPU, and the trainer's rest ---------------------------
QWEN_32B = ROOT / "configs" / "gpu" / "short_cot_qwen2.5-32b.yaml"


def budget_terms(p, name: str) -> dict[str, float]:
    return {t.name: t.bytes for t in p.budget(name).terms}


def test_32b_on_80gb_gpus_does_not_fit_the_vllm_engines_share(capsys):
    """The issue's case: 4 × 8 GPUs of 78 GiB, vLLM colocated with gpu_memory_utilization 0.6 and
    tensor_parallel_size 1. Qwen2.5-32B: L = 64, h = 5120, i = 27648, 40 heads, 8 KV heads of 128,
    V = 152,064, untied. One layer: q 5120² + 5120, k and v 5120·1024 + 1024 each, o 5120², MLP
    3·5120·27648, two norms 2·5120 = 487,605,248; root: 2·152,064·5120 + 5120 = 1,557,140,480;
    N = 64·487,605,248 + 1,557,140,480 = 32,763,876,352.
    Engine (bf16, e = 2): weights N·2/1 = 65,527,752,704 B = 61.0275 GiB; one 8,192-token sequence
    of KV cache 8192·64·2·8·128·2 = 2^31 B = 2 GiB; 63.0275 GiB > 0.6·78 = 46.8 GiB: does not fit.
    Trainer (HSDP 4 × 8, offloaded states, bf16, checkpointing): gathered (2·487,605,248 +
    1,557,140,480)·2 = 5,064,701,952; activations 8192·(64·2·5120 + 348,320) = 8,222,146,560
    (348,320 = 16·5120 + 2·(4·5120 + 2·1024 + 4·27648) + 4·40); logits 8192·152,064·4 =
    4,982,833,152; the step's batch 2048·8192·31 = 520,093,696; overhead 2 GiB; 20,937,259,008 B =
    19.4994 GiB <= 0.4·78 = 31.2 GiB: fits. The old single total, 46.8 + 19.50 = 66.30 of 78 GiB,
    said it fit."""
    p = plan(load_config(str(QWEN_32B), []), gpus=8, nodes=4, gpu_memory_gib=78)
    assert not p.fits
    engine, trainer = p.budget("vLLM engine"), p.budget("trainer")
    assert budget_terms(p, "vLLM engine") == pytest.approx(
        {"vLLM weights (bfloat16, 1/1)": 65_527_752_704, "vLLM KV cache (one 8,192-token sequence)": 2**31}
    )
    assert engine.total_gib == pytest.approx(63.0275, abs=1e-4)
    assert engine.capacity_gib == pytest.approx(46.8) and not engine.fits
    assert trainer.total_gib == pytest.approx(20_937_259_008 / GIB) == pytest.approx(19.4994, abs=1e-4)
    assert trainer.capacity_gib == pytest.approx(31.2) and trainer.fits
    cmd = ["plan", str(QWEN_32B), "--nodes", "4", "--gpus", "8", "--gpu-memory", "78"]
    assert main(cmd) == 1
    out = capsys.readouterr().out
    assert "the vLLM engine's budget is exceeded: 63.03 GiB > 46.80 GiB" in out
    assert "the trainer's fits (19.50 of 31.20 GiB)" in out
    assert "largest terms, and what shrinks them (vLLM engine's budget)" in out
    # no utilization holds both: the engine needs 63.03/78 = 0.808, the trainer leaves 1 - 19.50/78 = 0.750
    assert "no rollout.vllm.gpu_memory_utilization holds both budgets" in out
    # tp = 2: 61.03/2 + 2/2 (4 of the 8 KV heads per GPU) = 30.51 + 1 = 31.51 GiB <= 46.8
    assert "rollout.vllm.tensor_parallel_size=2: the engine's terms then take 31.51 GiB" in out


def test_32b_fits_the_h200s_its_header_names():
    """4 × 8 GPUs of 139 GiB: the same terms as above against 0.6·139 = 83.4 GiB (engine, 63.0275:
    fits) and 0.4·139 = 55.6 GiB (trainer, 19.4994: fits); the GPU holds the engine's whole share
    plus the trainer's terms, 83.4 + 19.4994 = 102.8994 GiB."""
    p = plan(load_config(str(QWEN_32B), []), gpus=8, nodes=4, gpu_memory_gib=139)
    engine, trainer = p.budget("vLLM engine"), p.budget("trainer")
    assert (engine.capacity_gib, trainer.capacity_gib) == pytest.approx((83.4, 55.6))
    assert (engine.total_gib, trainer.total_gib) == pytest.approx((63.0275, 19.4994), abs=1e-4)
    assert engine.fits and trainer.fits and p.fits
    assert p.total_gib == pytest.approx(102.8994, abs=1e-4)


TINY_VLLM = [
    "model.path=tiny:h128-L8",
    "rollout.engine=vllm",
    "rollout.sync.verify=off",  # an engine with tensor parallelism cannot be fingerprinted
    "rollout.max_episode_tokens=256",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "trainer.micro_batch_size=2",
]


def test_tensor_parallel_splits_the_engines_weights_and_kv_heads():
    """tiny:h128-L8 in fp32 (e = 4), N = 2,035,840, 2 KV heads of 32, 8 layers, ctx 256.
    tp = 1: weights 4·N = 8,143,360; KV 256·8·2·2·32·4 = 1,048,576.
    tp = 2: weights 4·N/2 = 4,071,680; KV with ⌈2/2⌉ = 1 head, 256·8·2·1·32·4 = 524,288.
    tp = 4: weights 4·N/4 = 2,035,840; KV still 1 head per GPU (vLLM replicates them), 524,288."""
    by_tp = {
        tp: budget_terms(
            plan(load_config(None, [*TINY_VLLM, f"rollout.vllm.tensor_parallel_size={tp}"]), gpus=4),
            "vLLM engine",
        )
        for tp in (1, 2, 4)
    }
    for tp, weights, kv in [(1, 8_143_360, 1_048_576), (2, 4_071_680, 524_288), (4, 2_035_840, 524_288)]:
        assert by_tp[tp] == pytest.approx(
            {f"vLLM weights (float32, 1/{tp})": weights, "vLLM KV cache (one 256-token sequence)": kv}
        )


def test_a_tensor_parallel_size_that_does_not_divide_a_nodes_ranks_is_refused(capsys):
    p = plan(load_config(None, [*TINY_VLLM, "rollout.vllm.tensor_parallel_size=3"]), gpus=4, nodes=2)
    assert not p.fits and [q.key for q in p.placement.problems] == ["rollout.vllm.tensor_parallel_size"]
    assert re.search(r"tensor_parallel_size=3 does not divide the 4 trainer ranks.*\[1, 2, 4\]", render(p))
    p = plan(load_config(None, [*TINY_VLLM, "rollout.vllm.tensor_parallel_size=16"]), gpus=8, nodes=2)
    assert "tensor_parallel_size=16 does not divide the 8 trainer ranks per node" in render(p)
    # the command says so, names the key, and exits 1
    cmd = [
        "plan",
        str(ROOT / "configs" / "quickstart.yaml"),
        *TINY_VLLM[1:],
        "rollout.vllm.tensor_parallel_size=3",
    ]
    assert main([*cmd, "--gpus", "4"]) == 1
    out = capsys.readouterr().out
    assert "REFUSED (rollout.vllm.tensor_parallel_size)" in out
    assert "verdict: REFUSED: the placement cannot work (change rollout.vllm.tensor_parallel_size" in out


def test_the_trainers_budget_exceeded_while_the_engine_fits():
    """A 4 GiB GPU with gpu_memory_utilization 0.9: the engine's 3.6 GiB holds its 8,143,360 +
    1,048,576 = 9,191,936 B = 0.00856 GiB; the trainer's 0.4 GiB does not hold its fp32 terms
    (weights 4N, gradients 4N, AdamW 8N = 32,573,440; activations 512·8·11,792 = 48,300,032 with
    11,792 = 16·128 + 4·(4·128 + 2·64 + 4·448) + 4·4; logits 512·1024·8 = 4,194,304; the step's
    batch 16·256·31 = 126,976) plus 2 GiB of overhead: 85,194,752 B + 2 GiB = 2.07934 GiB.
    Utilizations from ⌈0.00856/4⌉ = 0.01 up to ⌊1 - 2.07934/4⌋ = ⌊0.48016⌋ = 0.48 hold both."""
    cfg = load_config(None, [*TINY_VLLM, "rollout.vllm.gpu_memory_utilization=0.9"])
    p = plan(cfg, gpus=1, gpu_memory_gib=4.0)
    engine, trainer = p.budget("vLLM engine"), p.budget("trainer")
    assert engine.total_gib == pytest.approx(9_191_936 / GIB) and engine.fits
    assert trainer.total_gib == pytest.approx(85_194_752 / GIB + 2) == pytest.approx(2.07934, abs=1e-5)
    assert trainer.capacity_gib == pytest.approx(0.4) and not trainer.fits and not p.fits
    out = render(p)
    assert "the trainer's budget is exceeded: 2.08 GiB > 0.40 GiB" in out
    assert "the vLLM engine's fits (0.01 of 3.60 GiB)" in out
    assert "largest terms, and what shrinks them (trainer's budget)" in out
    assert "rollout.vllm.gpu_memory_utilization between 0.01 and 0.48" in out


# -- the activation formula against autograd's saved tensors ------------------------------------------
def saved_bytes(model, ids, autocast: bool) -> int:
    """Bytes of the distinct storages autograd saves inside the decoder layers for the backward,
    without the parameters and their bf16 copies (tensors with no dimension of length T)."""
    T = ids.shape[1]
    seen: dict[int, int] = {}
    inside = [False]

    def pack(t):
        if inside[0] and T in t.shape:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
        layer.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        model(input_ids=ids)
    return sum(seen.values())


@pytest.fixture(scope="module")
def mid_model_dir(tmp_path_factory) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("plan") / "h256"
    config = Qwen2Config(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1024,
        attn_implementation="sdpa",
    )
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


@pytest.mark.parametrize("bf16, checkpointing", [(False, False), (True, False), (False, True), (True, True)])
def test_activation_estimate_matches_autograds_saved_tensors(mid_model_dir, bf16, checkpointing):
    """Within 5%: fp32, autocast bf16 (projection inputs cast once per projection), and gradient
    checkpointing (each layer's input, plus one layer recomputed in the backward)."""
    from transformers import AutoModelForCausalLM

    T = 512
    cfg = load_config(
        None,
        [
            f"model.path={mid_model_dir}",
            f"model.gradient_checkpointing={str(checkpointing).lower()}",
            f"trainer.bf16={str(bf16).lower()}",
            f"rollout.max_episode_tokens={T}",
            "trainer.micro_batch_size=1",
        ],
    )
    estimate = terms(plan(cfg))["activations (one micro-batch)"]
    model = AutoModelForCausalLM.from_pretrained(mid_model_dir, attn_implementation="sdpa").train()
    ids = torch.randint(0, 1024, (1, T), generator=torch.Generator().manual_seed(0))
    measured = saved_bytes(model, ids, bf16)
    if checkpointing:
        one_layer = measured / 2  # what the backward recomputes and keeps for one layer
        enable_checkpointing(model)
        measured = saved_bytes(model, ids, bf16) + one_layer
    assert measured == pytest.approx(estimate, rel=0.05)


# -- the command and configs/gpu -------------------------------------------------------------------------
def test_plan_command_prints_the_terms_and_exits_1_when_it_does_not_fit(capsys):
    assert main(["plan", str(ROOT / "configs" / "quickstart.yaml"), "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "activations (one micro-batch)" in out and "fits" in out
    assert main(["plan", str(ROOT / "configs" / "quickstart.yaml"), "--gpu-memory", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "largest terms, and what shrinks them" in out


GPU_CONFIGS = sorted((ROOT / "configs" / "gpu").glob("*.yaml"))


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_each_gpu_config_fits_the_hardware_it_names(path, capsys):
    """Each config's header names its hardware with the ``agentrl plan`` commands that check it (the
    32 B config two: 4 × 8 H200s, and one node of 80 GB GPUs with its engines in Ray workers): every
    one places every process and fits every budget, so what a header promises the plan holds."""
    text = path.read_text()
    assert re.search(r"^# Hardware: .+", text, re.M), f"{path.name} names no hardware"
    commands = header_plans(path)
    assert commands, f"{path.name} has no '# agentrl plan ...' line"
    for args in commands:
        assert (ROOT / args[1]).resolve() == path.resolve()
        assert main([args[0], str(ROOT / args[1]), *args[2:]]) == 0, capsys.readouterr().out
        assert "verdict: fits" in capsys.readouterr().out


R1_DISTILL = ROOT / "configs" / "gpu" / "long_cot_r1-distill-qwen-1.5b.yaml"


def test_a_real_vocabulary_counts_one_chunk_of_the_head():
    """R1-Distill-Qwen-1.5B (V = 151,936) under DDP: the head is applied in chunks of
    ⌊2²³/V⌋ = 55 positions, so the logits term is 55·151,936·4·CHUNK_COPIES, whatever the tokens per
    micro-batch; with trainer.chunked_head=never it is the whole t·V·2c again."""
    chunked = plan(load_config(str(R1_DISTILL), []), gpus=1, gpu_memory_gib=78)
    whole = plan(load_config(str(R1_DISTILL), ["trainer.chunked_head=never"]), gpus=1, gpu_memory_gib=78)
    s = sizes(load_config(str(R1_DISTILL), []), architecture(load_config(str(R1_DISTILL), [])), 1, 1)
    assert terms(chunked)["logits (the head in chunks)"] == 55 * 151_936 * 4 * CHUNK_COPIES
    assert terms(whole)["logits and their gradient"] == s.tokens * 151_936 * 2 * s.c
    assert "logits and their gradient" not in terms(chunked)
    fsdp = plan(load_config(str(R1_DISTILL), ["trainer.strategy=fsdp2"]), gpus=1, gpu_memory_gib=78)
    assert "logits and their gradient" in terms(fsdp)  # FSDP2 gathers the head only inside the forward


@pytest.mark.study  # a measurement of a documented result (docs/performance.md), ~45 s
def test_the_logits_terms_match_a_measurement():
    """bench/logits_memory.py's measurement (peak resident memory of a fresh process, above the same
    pass at a 1 k vocabulary) against the plan's two logits terms, at V = 151,669 and T = 1,024 with
    gradient: the whole logits t·V·2c within 10 %, the chunked head under its term and above a third of it."""
    import json
    import os
    import subprocess
    import sys

    def peak(vocab: int, chunked: bool) -> int:
        spec = {"vocab": vocab, "tokens": 1024, "chunked": chunked, "grad": True, "hidden": 64}
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
        out = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "logits_memory.py"), "--one", json.dumps(spec)],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]

    base = peak(1024, False)
    whole, chunked = peak(151_669, False) - base, peak(151_669, True) - base
    assert whole == pytest.approx(1023 * 151_669 * 2 * 4, rel=0.10)
    term = 55 * 151_669 * 4 * CHUNK_COPIES
    assert term / 3 < chunked <= term, (chunked, term)
