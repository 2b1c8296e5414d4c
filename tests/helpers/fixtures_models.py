"""Reusable fixtures: a tiny tokenizer and a tiny 2-layer Qwen2 model, built once per test session.

Imported into ``tests/conftest.py`` (``from tests.helpers.fixtures_models import *``). The model
directory is shared: tests that change weights must load their own copy (``tiny_policy`` does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.models import build_tiny_model, load_policy, train_tokenizer

__all__ = ["peaky_policy", "tiny_model_dir", "tiny_policy", "tiny_tokenizer"]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny BPE tokenizer (vocab 1024, seed 0), trained in about a second."""
    return train_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """An HF-format directory with a 2-layer h128 Qwen2 model (seed 0) and the tiny tokenizer."""
    out = tmp_path_factory.mktemp("tiny") / "h128-L2"
    return build_tiny_model(out, "h128-L8", num_layers=2, tokenizer=tiny_tokenizer, seed=0)


@pytest.fixture
def tiny_policy(tiny_model_dir):
    """A fresh (model, tokenizer) loaded from ``tiny_model_dir`` in float32: safe to modify."""
    return load_policy(tiny_model_dir)


@pytest.fixture
def peaky_policy(tiny_model_dir):
    """Like ``tiny_policy`` but with the output head scaled up so next-token distributions are far
    from uniform (a random init gives nearly flat ones): top-k, top-p and greedy then make visible
    differences. Its logits have a standard deviation of about 2.3 nats."""
    model, tokenizer = load_policy(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return model, tokenizer
