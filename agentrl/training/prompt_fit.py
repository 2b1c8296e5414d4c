"""What an episode can hold, and the task prompts and demonstrations that do not fit in it.

An episode holds at most ``rollout.max_episode_tokens`` tokens, and never more than the model's
context (``max_position_embeddings``). A task whose prompt alone reaches that limit stops every
episode before the model writes a token: the config check (``preflight.check_inputs``) names such
tasks before any work. A demonstration longer than the model's context asks the warm start for a
sequence no position of the model was trained for (100k characters asked for 91 GB): the warm start
leaves such demonstrations out by name, and refuses when none is left."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.env import Task

BYTE_SLACK = 8
"""A token covers at least one byte of text in byte-level and SentencePiece tokenizers, so a prompt
of fewer UTF-8 bytes than the limit less this slack (for the tokens a tokenizer adds around a text)
fits without being tokenized: only long prompts pay for the tokenizer."""


def model_context(path: str) -> int | None:
    """``max_position_embeddings`` of the model in the local directory ``path``, read from its
    config.json without loading it; None for a model not (yet) in a local directory (a hub name, a
    ``tiny:`` preset, a GGUF file: they are checked once loaded) or a config that does not say."""
    try:
        config = json.loads((Path(path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or config.get("text_config", {}).get(
        "max_position_embeddings"
    )
    return int(value) if value else None


def loaded_context(model: Any) -> int | None:
    """The context of a loaded transformers model (its text model's, for a multimodal one)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def episode_limit(max_episode_tokens: int, context: int | None) -> tuple[int, str]:
    """The most tokens an episode may hold (``rollout.max_episode_tokens``) given the model's
    ``context``, and what sets it."""
    limit, why = max_episode_tokens, f"rollout.max_episode_tokens={max_episode_tokens}"
    if context is not None and context < limit:
        return context, f"the model's context, under {why}"
    return limit, why


def over_long_prompts(
    max_episode_tokens: int, model_path: str, tasks: Sequence[Task], split: str, tokenizer: Callable[[], Any]
) -> str | None:
    """The problem with ``split``'s tasks whose prompt alone fills the episode (``episode_limit``
    of the model at ``model_path``), naming up to three with their lengths; None when every prompt
    fits. ``tokenizer`` is called only when some prompt is long enough to need counting."""
    limit, why = episode_limit(max_episode_tokens, model_context(model_path))
    long = [t for t in tasks if len(t.prompt.encode()) + BYTE_SLACK >= limit]
    if not long:
        return None
    tok = tokenizer()
    sizes = [(t, len(tok(t.prompt, add_special_tokens=False, verbose=False)["input_ids"])) for t in long]
    over = [(t, n) for t, n in sizes if n >= limit]
    if not over:
        return None
    shown = ", ".join(f"{t.id!r} ({n} tokens, {len(t.prompt)} characters)" for t, n in over[:3])
    return (
        f"data ({split} split): {len(over)} of {len(tasks)} task prompt(s) cannot fit an episode, which holds "
        f"{limit} tokens ({why}), before the system prompt, the tools or one generated token: {shown}. Drop or "
        "shorten those rows, or raise rollout.max_episode_tokens (up to the model's context)"
    )


def fitting_examples(
    max_episode_tokens: int,
    examples: list[tuple[list[int], list[int]]],
    names: Sequence[str],
    context: int | None,
    log: Callable[[str], None],
) -> list[tuple[list[int], list[int]]]:
    """``examples`` without the demonstrations longer than the model's ``context`` (no position
    past it was trained, and one such sequence can ask for tens of GB), each dropped one named
    (``names[i]``) in the log; ``ValueError`` when none is left. Those that fit the context but
    not ``max_episode_tokens`` are kept, and the log counts them: RL's episodes stop there."""
    longest = max((len(ids) for ids, _ in examples), default=0)
    budget = max_episode_tokens
    if context is not None and longest > context:
        dropped = [(names[i], len(ids)) for i, (ids, _) in enumerate(examples) if len(ids) > context]
        shown = ", ".join(f"{name} ({n} tokens)" for name, n in dropped[:5])
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        examples = [e for e in examples if len(e[0]) <= context]
        if not examples:
            raise ValueError(
                f"SFT warm start: all {len(dropped)} demonstrations are longer than the model's context ({context} "
                f"tokens): {shown}{more}. Shorten them"
            )
        log(
            f"warning: SFT warm start: {len(dropped)} demonstration(s) are longer than the model's context ({context} "
            f"tokens) and are left out: {shown}{more}"
        )
    over = sum(len(ids) > budget for ids, _ in examples)
    if over:
        log(
            f"note: SFT warm start: {over} of {len(examples)} demonstrations are longer than an RL episode holds "
            f"(rollout.max_episode_tokens={budget}): RL's episodes stop there"
        )
    return examples
