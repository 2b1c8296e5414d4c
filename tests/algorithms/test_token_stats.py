"""Per-token log-probs and entropy from logits or hidden states, chunked."""

import math

import pytest
import torch

from agentrl.algorithms import (
    entropy_from_logits,
    token_logprobs_and_entropy,
    token_logprobs_and_entropy_from_hidden,
)


def test_hand_example_two_tokens():
    # logits [0, ln 3] -> π = [1/4, 3/4]; logp(id 1) = ln .75 = -0.287682;
    # H = .25·ln 4 + .75·ln(4/3) = .346574 + .215762 = .562335.
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    logp, ent = token_logprobs_and_entropy(logits, torch.tensor([[1]]))
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(0.25 * math.log(4) + 0.75 * math.log(4 / 3), abs=1e-6)
    # temperature 2: logits [0, .549306] -> π1 = √3/(1+√3) = .633975.
    logp_t, ent_t = token_logprobs_and_entropy(logits, torch.tensor([[1]]), temperature=2.0)
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    assert logp_t.item() == pytest.approx(math.log(p1), abs=1e-6)
    assert ent_t.item() == pytest.approx(-(p1 * math.log(p1) + (1 - p1) * math.log(1 - p1)), abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_chunking_matches_direct(chunk):
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(3, 5, 11, generator=g)
    ids = torch.randint(11, (3, 5), generator=g)
    logp, ent = token_logprobs_and_entropy(logits, ids, temperature=0.7, chunk_size=chunk)
    ref_logp = torch.log_softmax(logits / 0.7, -1).gather(-1, ids[..., None]).squeeze(-1)
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, entropy_from_logits(logits, 0.7), rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [5, 100])  # checkpointed chunks; one chunk, not checkpointed
def test_from_hidden_values_and_gradients_match_full_logits(chunk):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(13, (2, 6), generator=g)
    logp, ent = token_logprobs_and_entropy_from_hidden(hidden, weight, ids, temperature=1.3, chunk_size=chunk)
    (logp.sum() + 0.5 * ent.sum()).backward()
    g_h, g_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    z = hidden @ weight.T / 1.3  # [2, 6, 13], the unchunked reference
    ref_logp = torch.log_softmax(z, -1).gather(-1, ids[..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    (ref_logp.sum() + 0.5 * ref_ent.sum()).backward()
    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(g_h, hidden.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_w, weight.grad, rtol=1e-5, atol=1e-6)


def test_no_grad_path_and_dtype():
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    with torch.no_grad():
        logp, ent = token_logprobs_and_entropy(logits, torch.zeros(2, 3, dtype=torch.long), chunk_size=2)
    assert logp.dtype == ent.dtype == torch.float32 and logp.shape == (2, 3)
    assert (ent >= 0).all() and (ent <= math.log(5) + 1e-5).all()


def test_from_hidden_under_bf16_autocast_follows_the_autocast_reference():
    """``trainer.bf16``: the head's products run in bf16 in the forward and in the written-out
    backward (the forward's autocast state is restored there), the statistics in fp32; values and
    gradients agree with autograd through the same autocast computation, within bf16 rounding."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(20, 16, generator=g, requires_grad=True)
    weight = (0.5 * torch.randn(50, 16, generator=g)).requires_grad_()
    ids = torch.randint(50, (20,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = token_logprobs_and_entropy_from_hidden(hidden[None], weight, ids[None], chunk_size=6)
    (logp.sum() + 0.5 * ent.sum()).backward()
    g_h, g_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = torch.nn.functional.linear(hidden, weight).float()
    ref_logp = torch.log_softmax(z, -1).gather(-1, ids[:, None]).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    (ref_logp.sum() + 0.5 * ref_ent.sum()).backward()
    assert logp.dtype == torch.float32 and g_h.dtype == g_w.dtype == torch.float32
    torch.testing.assert_close(logp[0], ref_logp.detach(), rtol=0, atol=1e-5)  # same bf16 logits
    torch.testing.assert_close(ent[0], ref_ent.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(g_h, hidden.grad, rtol=2e-2, atol=2e-2)  # bf16 products in the backward
    torch.testing.assert_close(g_w, weight.grad, rtol=2e-2, atol=2e-2)
