"""The trainer's float32 attention under CPU bf16 autocast (training/cpu_attention.py): exactly
``sdpa`` outside autocast, with a shared-prefix KV cache too (the masks are ``sdpa``'s); under
autocast its attention runs in float32, closer to the float32 model than bf16 ``sdpa``; switched on
only for bf16 autocast on the CPU with ``sdpa``."""

from __future__ import annotations

import pytest
import torch

from agentrl.training import cpu_attention
from agentrl.training.forward import prefix_plan, suffix_logits
from tests.helpers.llama import small_llama


@pytest.fixture(scope="module")
def llama():
    return small_llama(256, 64, 128, heads=4, kv_heads=2, layers=2, attn_implementation="sdpa")


def rows() -> tuple[torch.Tensor, int, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (4, 24), generator=gen)
    ids[:, :10] = ids[0, :10]  # one shared prompt: the forward runs it once and attends past it
    plan = prefix_plan(ids, torch.full((4,), 24), limit=9)
    assert plan.share > 0
    return ids, plan.share, plan.owners


def logits(model, impl: str, bf16: bool) -> torch.Tensor:
    model.set_attn_implementation(impl)
    ids, share, owners = rows()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return suffix_logits(model, ids, share, owners).float()


def test_outside_autocast_it_is_sdpa_exactly_with_a_shared_prefix(llama):
    assert cpu_attention.apply(llama, torch.device("cpu"), True, lambda _: None)
    try:
        ours = logits(llama, cpu_attention.ATTENTION, bf16=False)
        plain = logits(llama, "sdpa", bf16=False)
        assert torch.equal(ours, plain)
    finally:
        llama.set_attn_implementation("sdpa")


def test_under_autocast_the_attention_is_float32(llama, monkeypatch):
    seen = []
    from transformers.integrations import sdpa_attention

    real = sdpa_attention.sdpa_attention_forward

    def spy(module, q, k, v, mask, **kw):
        seen.append((q.dtype, torch.is_autocast_enabled("cpu")))
        return real(module, q, k, v, mask, **kw)

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", spy)
    monkeypatch.setattr(cpu_attention, "_registered", cpu_attention._registered)
    assert cpu_attention._registered()  # re-registered: the wrapper now calls the spy
    try:
        fp32 = logits(llama, "sdpa", bf16=False)
        ours = logits(llama, cpu_attention.ATTENTION, bf16=True)
    finally:
        llama.set_attn_implementation("sdpa")
        monkeypatch.undo()
        cpu_attention._registered()
    assert seen and all(dtype == torch.float32 and not on for dtype, on in seen[-4:])
    assert (ours - fp32).abs().max() < 0.1  # bf16's products around it, float32 inside


def test_it_is_switched_on_only_for_cpu_bf16_autocast_over_sdpa(llama):
    cpu, said = torch.device("cpu"), []
    try:
        assert not cpu_attention.apply(llama, cpu, False, said.append)  # float32: nothing to gain
        assert not cpu_attention.apply(llama, torch.device("cuda"), True, said.append)  # the GPU's kernels
        llama.set_attn_implementation("eager")
        assert not cpu_attention.apply(llama, cpu, True, said.append)  # the user's choice is kept
        llama.set_attn_implementation("sdpa")
        assert cpu_attention.apply(llama, cpu, True, said.append)
        assert llama.config._attn_implementation == cpu_attention.ATTENTION
        assert said == [
            "bf16 autocast on the CPU: the attention runs in float32, whose backward is faster there (training/cpu_attention.py)"
        ]
    finally:
        llama.set_attn_implementation("sdpa")


def test_the_trainer_sets_it_up_under_trainer_bf16_on_the_cpu(llama):
    from agentrl.config.schema import ModelConfig
    from agentrl.parallel import sharding
    from agentrl.training.policy_setup import prepare_policy

    cpu = sharding.Replicated(0, 1, torch.device("cpu"))
    try:
        prepare_policy(ModelConfig(), 0, llama, cpu, lambda _: None, bf16=False)
        assert llama.config._attn_implementation == "sdpa"
        prepare_policy(ModelConfig(), 0, llama, cpu, lambda _: None, bf16=True)
        assert llama.config._attn_implementation == cpu_attention.ATTENTION
    finally:
        llama.set_attn_implementation("sdpa")
