"""``agentrl plan``: parameter counts and every memory term against hand-computed values, the
activation formula against the tensors autograd actually saves, and configs/gpu fitting the
hardware their comments name."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.plan import GIB, architecture, plan

ROOT = Path(__file__).resolve().parents[1]
# tiny:h128-L8: hidden 128, 8 layers, 4 heads (head_dim 32), 2 KV heads (kv width 64), MLP 448, vocab 1024
H, L, MLP, HEADS, KV, V = 128, 8, 448, 4, 64, 1024
LAYER = (
    (H * H + H) + 2 * (H * KV + KV) + H * H + 3 * H * MLP + 2 * H
)  # q(+bias), k, v(+bias), o, MLP, 2 norms
N = V * H + L * LAYER + H + V * H  # embeddings, layers, final norm, untied head


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
        "HF engine KV cache": 8 * 256 * L * 2 * KV * 4,  # min(64, 8 concurrent, 16 episodes) sequences
        "weight sync (streamed)": V * H * 4,
        "CUDA context, NCCL, allocator slack": 2 * GIB,
    }
    assert terms(p) == pytest.approx(want)
    assert p.total_gib == pytest.approx(sum(want.values()) / GIB)
    assert p.fits == (sum(want.values()) <= GIB)


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
        "HF engine KV cache": 4 * 128 * L * 2 * KV * 2,  # 4 episodes per rank
        "weight sync (streamed)": V * H * 2,
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
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
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
    """Each config's header names its hardware with the ``agentrl plan`` command that checks it."""
    text = path.read_text()
    assert re.search(r"^# Hardware: .+", text, re.M), f"{path.name} names no hardware"
    found = re.search(r"^#\s+agentrl plan (\S+)(.*)$", text, re.M)
    assert found, f"{path.name} has no '# agentrl plan ...' line"
    assert (ROOT / found.group(1)).resolve() == path.resolve()
    assert main(["plan", str(path), *shlex.split(found.group(2))]) == 0, capsys.readouterr().out
    assert "fits" in capsys.readouterr().out
