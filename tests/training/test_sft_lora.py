"""The SFT warm start under ``model.lora`` (``sft.weights``): adapters trained and merged by default,
every weight with ``sft.weights=full``; the plan counts what the warm start trains."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from agentrl.assembly.build import warm_start_key
from agentrl.assembly.sft import run_sft
from agentrl.config import ConfigError, load_config


def _cfg(tmp_path, model_dir, *extra: str):
    return load_config(
        "configs/quickstart.yaml",
        [
            f"model.path={model_dir}",
            f"run.output_dir={tmp_path / 'run'}",
            "sft.enabled=true",
            "sft.num_demos=8",
            "sft.steps=3",
            "sft.batch_size=4",
            "sft.lr=1e-2",
            "data.num_train=8",
            *extra,
        ],
    )


def _changed(before: dict, after: dict) -> set[str]:
    return {k for k in before if not (before[k] == after[k]).all()}


@pytest.mark.parametrize("weights", ["auto", "full"])
def test_under_lora_the_warm_start_trains_the_adapters_merged_or_every_weight(
    tmp_path, tiny_model_dir, weights
):
    """``auto`` under ``model.lora`` trains adapters on q_proj and v_proj and saves a plain model
    whose only changed weights are those two projections (W + (α/r)·B A); ``full`` changes the
    rest too (embeddings, MLPs)."""
    cfg = _cfg(tmp_path, tiny_model_dir, "model.lora.rank=4", "model.lora.target_modules=[q_proj,v_proj]",
               f"sft.weights={weights}")  # fmt: skip
    out = tmp_path / "warm"
    run_sft(cfg, str(tiny_model_dir), out, log=lambda _: None)
    assert (out / "config.json").exists() and not (out / "adapter_config.json").exists()  # a plain model
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(after) == set(before)  # the same names: no lora_A/lora_B left in the model
    changed = _changed(before, after)
    adapted = {k for k in before if k.endswith(("q_proj.weight", "v_proj.weight"))}
    if weights == "auto":
        assert changed == adapted, sorted(changed ^ adapted)
    else:
        assert adapted < changed and any("embed_tokens" in k or "mlp" in k for k in changed)


def test_a_lora_warm_start_is_cached_apart_and_lora_without_adapters_is_refused(tmp_path, tiny_model_dir):
    lora = _cfg(tmp_path, tiny_model_dir, "model.lora.rank=4")
    full = _cfg(tmp_path, tiny_model_dir, "model.lora.rank=4", "sft.weights=full")
    plain = _cfg(tmp_path, tiny_model_dir)
    assert warm_start_key(lora, "base") != warm_start_key(full, "base")
    assert warm_start_key(full, "base") == warm_start_key(plain, "base")  # full warm starts keep their key
    with pytest.raises(ConfigError, match=r"sft\.weights=lora .* model\.lora\.rank is 0"):
        _cfg(tmp_path, tiny_model_dir, "sft.weights=lora")


def test_the_plan_counts_the_warm_start_and_a_full_one_of_a_7b_model_does_not_fit_a_gpu():
    """configs/gpu/tool_use_qwen2.5-7b_lora.yaml: its plan said "fits" counting LoRA's AdamW moments
    only, while SFT trained every weight of the 7 B model (in forwards of 32 demonstrations); the warm
    start is now a budget of its own, with the adapters by default."""
    from agentrl.plan import plan, verdict

    path = "configs/gpu/tool_use_qwen2.5-7b_lora.yaml"
    lora = plan(load_config(path, []), gpus=1, gpu_memory_gib=78)
    full = plan(load_config(path, ["sft.weights=full", "sft.micro_batch_size=4"]), gpus=1, gpu_memory_gib=78)
    sft = {b.name: b for b in lora.budgets}["SFT warm start"]
    assert sft.total_gib <= 78 and verdict(lora).startswith("verdict: fits")
    terms = {t.name: t.bytes for t in {b.name: b for b in full.budgets}["SFT warm start"].terms}
    assert terms["AdamW moments"] == 2 * full.arch.params * 2  # every weight's two moments, bf16
    assert "DOES NOT FIT: the SFT warm start" in verdict(full)


def test_micro_batches_give_the_gradient_of_one_forward(tiny_model_dir):
    """``sft.micro_batch_size``: the batch's mean loss over its assistant tokens, accumulated over
    forwards of one demonstration, has the gradient of one forward of the whole batch."""
    import torch

    from agentrl.models import load_policy
    from agentrl.training.sft import _accumulate

    g = torch.Generator().manual_seed(0)
    examples = []
    for n in (6, 9, 12, 7):  # unequal lengths and answer sizes: the weighting matters
        ids = torch.randint(5, 900, (n,), generator=g).tolist()
        examples.append((ids, [0] * (n // 2) + [1] * (n - n // 2)))
    model, _ = load_policy(tiny_model_dir)
    seen = []
    for micro in (None, 1):
        model.zero_grad(set_to_none=True)
        loss, tokens = _accumulate(model, examples, 0, share_prefix=True, micro_batch_size=micro)
        seen.append((loss, tokens, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss_a, tok_a, g_a), (loss_b, tok_b, g_b) = seen
    assert tok_a == tok_b == sum(sum(m[1:]) for _, m in examples)
    assert abs(loss_a - loss_b) < 1e-5
    assert torch.allclose(g_a, g_b, rtol=1e-4, atol=1e-7), float((g_a - g_b).abs().max())
