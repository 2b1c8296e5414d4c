"""A tiny policy that has learnt one completion by heart, for tests that need a real model (the HF
engine's decode, vLLM) to write known text: after ``memorised_policy`` the model's greedy completion
of ``prompt`` is ``completion``, and sampling at temperature 1 gives it too with probability close to 1
(training stops once the greedy choice is right everywhere and the loss is below 0.05 nats a token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.models import load_policy


def memorised_policy(
    model_dir: Path, prompt: list[int], completion: list[int], max_steps: int = 300
) -> tuple[Any, Any]:
    """(model, tokenizer) loaded from ``model_dir`` and trained on ``prompt + completion`` until its
    greedy choice after ``prompt`` is ``completion`` (the loss on the completion's tokens only)."""
    model, tokenizer = load_policy(model_dir)
    torch.manual_seed(0)
    ids = torch.tensor([prompt + completion])
    targets = ids[0, len(prompt) :]
    optimiser = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(max_steps):
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        if loss.item() < 0.05 and torch.equal(logits.argmax(-1), targets):
            break
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    with torch.no_grad():
        greedy = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1)
    if not torch.equal(greedy, targets):
        raise AssertionError(
            f"the policy did not learn the completion in {max_steps} steps (loss {loss.item():.4f})"
        )
    return model, tokenizer
