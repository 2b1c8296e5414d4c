"""The output head applied in chunks (``trainer.chunked_head``): log-probs, entropies and gradients
equal to the whole-logits path within 1e-5 in fp32, with and without a shared prompt prefix, under
LoRA, and the choices ``auto``/``always``/``never`` make."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.config import ConfigError, load_config
from agentrl.parallel import sharding
from agentrl.training.batch import batch_forward
from agentrl.training.forward import output_head
from agentrl.training.passes import CHUNKED_HEAD_VOCAB, Passes
from tests.helpers.batches import synthetic_batch

# the tests that build a peft model themselves: peft reads transformers' deprecated
# is_gradient_checkpointing (agentrl's own lora.apply hides the same warning)
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.* is deprecated:FutureWarning")

VOCAB = 40_000  # above CHUNKED_HEAD_VOCAB, so auto chunks; small layers keep the test fast


def llama(vocab: int = VOCAB, tie: bool = True, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tie, max_position_embeddings=128,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).float()


def both_paths(model, batch, grad: bool, share_prefix: bool, temperature: float = 0.7):
    """(logp, entropy, gradients) from the whole logits and from the chunked head."""
    out = []
    for head in (None, output_head(model)):
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grad):
            lp, h = batch_forward(
                model, batch, 3, temperature, grad=grad, share_prefix=share_prefix, head=head
            )
        grads = {}
        if grad:
            ((lp * batch.mask).sum() + 0.3 * (h * batch.mask).sum()).backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((lp.detach(), h.detach(), grads))
    return out


@pytest.mark.parametrize("share_prefix", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_chunked_head_equals_the_whole_logits(share_prefix, grad):
    model = llama()
    batch = synthetic_batch(VOCAB, n=6, seed=1)
    (lp0, h0, g0), (lp1, h1, g1) = both_paths(model, batch, grad, share_prefix)
    assert torch.allclose(lp0, lp1, atol=1e-5, rtol=0) and torch.allclose(h0, h1, atol=1e-5, rtol=0)
    assert g0.keys() == g1.keys()
    for name in g0:
        scale = g0[name].abs().max().clamp(min=1.0)
        assert torch.allclose(g0[name], g1[name], atol=1e-5 * scale, rtol=0), name


def test_the_head_is_really_applied_in_chunks(monkeypatch):
    """No tensor of B·T·V elements is made on the chunked path, in the forward or the backward: the
    head's output is one chunk at a time, and the backward recomputes each chunk once."""
    import agentrl.algorithms.token_stats as ts

    model = llama()
    batch = synthetic_batch(VOCAB, n=6, seed=2)
    monkeypatch.setattr(ts, "CHUNK_ELEMENTS", 8 * VOCAB)  # 8 positions a chunk
    widest: list[int] = []
    real = ts._head_logits

    def recording(hidden, weight, bias, temperature):
        widest.append(hidden.shape[0])
        return real(hidden, weight, bias, temperature)

    monkeypatch.setattr(ts, "_head_logits", recording)
    positions = 6 * (batch.ids.shape[1] - 1)
    with torch.no_grad():
        batch_forward(model, batch, 6, 1.0, head=output_head(model))
    assert widest and max(widest) <= 8 and sum(widest) == positions
    widest.clear()
    lp, h = batch_forward(model, batch, 6, 1.0, grad=True, head=output_head(model))
    (lp.sum() + h.sum()).backward()
    assert max(widest) <= 8 and sum(widest) == 2 * positions  # the forward, then the backward's recompute


def test_lora_policy_keeps_a_plain_head_and_matches(tmp_path):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        llama(tie=False), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    for n, p in model.named_parameters():  # nonzero B: the adapters change the outputs
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)
    assert output_head(model) is not None
    batch = synthetic_batch(VOCAB, n=4, seed=3)
    (lp0, h0, g0), (lp1, h1, g1) = both_paths(model, batch, True, False)
    assert torch.allclose(lp0, lp1, atol=1e-5, rtol=0) and torch.allclose(h0, h1, atol=1e-5, rtol=0)
    for name in g0:
        assert torch.allclose(g0[name], g1[name], atol=1e-5, rtol=0), name


def test_a_lora_adapted_head_is_never_bypassed():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(llama(tie=False), peft.LoraConfig(r=4, target_modules=["lm_head"]))
    assert output_head(model) is None


def passes(*overrides: str, strategy=None) -> Passes:
    cfg = load_config(None, ["trainer.bf16=false", *overrides])  # auto is decided by a run's start
    strategy = strategy or sharding.Replicated(0, 1, torch.device("cpu"))
    return Passes(cfg.trainer, cfg.rollout.temperature, strategy, True, True)


def test_auto_always_and_never():
    big, small = llama(), llama(vocab=1024)
    assert CHUNKED_HEAD_VOCAB == 32768
    assert passes().chunked_head(big) is output_head(big)  # auto, 40 k: chunked
    assert passes().chunked_head(small) is None  # auto, 1 k: the whole logits are small
    assert passes("trainer.chunked_head=always").chunked_head(small) is output_head(small)
    assert passes("trainer.chunked_head=never").chunked_head(big) is None


def test_on_refuses_what_it_cannot_honour():
    peft = pytest.importorskip("peft")
    adapted = peft.get_peft_model(llama(tie=False), peft.LoraConfig(r=4, target_modules=["lm_head"]))
    with pytest.raises(ConfigError, match=r"trainer\.chunked_head=always: this model.s output head"):
        passes("trainer.chunked_head=always").chunked_head(adapted)
    assert passes().chunked_head(adapted) is None  # auto: the whole logits, correctly
    with pytest.raises(ConfigError, match=r"trainer\.chunked_head"):
        load_config(None, ["trainer.chunked_head=always", "trainer.strategy=fsdp2"])
