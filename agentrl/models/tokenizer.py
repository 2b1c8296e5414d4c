"""Load a tokenizer so its ids are exactly the ones it was trained with.

Our tiny tokenizers (``agentrl.models``) carry ``"agentrl_tiny": true`` in tokenizer_config.json and
are loaded through ``PreTrainedTokenizerFast``: transformers' AutoTokenizer maps ``model_type=qwen2``
to ``Qwen2Tokenizer``, which rebuilds the pre-tokenizer from the vocabulary and drops anything that is
not Qwen's (docs/MACHINE.md pitfall). Every other tokenizer goes through ``AutoTokenizer``, as its
model expects. This module imports no model code, so reading transcripts stays fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TINY_MARKER = "agentrl_tiny"
"""Key in tokenizer_config.json that marks an agentrl tiny tokenizer."""


def is_tiny_tokenizer_dir(path: str | os.PathLike) -> bool:
    cfg = Path(path) / "tokenizer_config.json"
    if not cfg.is_file():
        return False
    return bool(json.loads(cfg.read_text()).get(TINY_MARKER, False))


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer of a local directory (or hub name). ``tiny:PRESET`` names must be resolved to
    their directory first (``agentrl.models.resolve_model_path``)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # ~5 s: only when one is loaded

    if str(path).startswith("tiny:"):
        raise ValueError(f"{path!r}: resolve tiny:PRESET names with agentrl.models.resolve_model_path first")
    if is_tiny_tokenizer_dir(path):
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))
