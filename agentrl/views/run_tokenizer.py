"""The tokenizer of a recorded run, for the tools that read its transcripts (``agentrl doctor``,
``replay``, ``inspect``): found next to the run, never fetched from a hub."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrl.models.tokenizer import load_tokenizer
from agentrl.transcripts import load_run_config, run_dir_of


def tokenizer_candidates(path: str | os.PathLike[str], model: str | None = None) -> list[str]:
    """Where a tokenizer may be found, best first: the explicit one, the run's ``model.path`` when it
    is a local directory (relative paths are tried against the run directory too), the newest
    checkpoint (saved with its tokenizer), then ``model.path`` as a name (``tiny:PRESET``)."""
    out = [model] if model else []
    run = run_dir_of(path)
    if run is not None:
        mp = str((load_run_config(run).get("model") or {}).get("path") or "")
        local = [c for c in (mp, str(run / mp)) if mp and Path(c).is_dir()]
        out.extend(local[:1])
        ckpts = sorted((run / "checkpoints").glob("step_*"), key=lambda d: _int_suffix(d.name), reverse=True)
        out.extend(str(c) for c in ckpts)
        if mp and not local:
            out.append(mp)
    return list(dict.fromkeys(out))


def _int_suffix(name: str) -> int:
    m = re.search(r"(\d+)$", name)
    return int(m.group(1)) if m else -1


def first_tokenizer(candidates: Iterable[str]) -> tuple[Any, str | None, list[str]]:
    """Load the first candidate that works: (tokenizer or None, where from, errors seen)."""
    errors = []
    for c in candidates:
        if not Path(c).exists() and not c.startswith("tiny:"):  # never reach for a hub offline
            errors.append(f"{c}: not a local path")
            continue
        try:
            if c.startswith("tiny:"):  # the cached tiny model's directory (built on first use)
                from agentrl.models import resolve_model_path

                c = resolve_model_path(c)
            return load_tokenizer(c), c, errors
        except Exception as e:  # a broken candidate must not stop us trying the next one
            errors.append(f"{c}: {type(e).__name__}: {e}")
    return None, None, errors


# -- the --filter mini language -----------------------------------------------------------------
