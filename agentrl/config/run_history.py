"""A run's history: every start and resume, with the config keys each one changed.

``RUN/history.jsonl`` is append-only, one JSON object per line:

    {"event": "start", "step": 0, "time": "2026-11-25T17:02:11Z", "changed": {}, "forced": []}
    {"event": "resume", "step": 22, "checkpoint": "step_22", "time": "...",
     "changed": {"trainer.lr": [3e-05, 1e-05]}, "forced": []}

``step`` is the first step that session runs. ``changed`` maps each dotted key whose value differs
from the config the run had until then to ``[old, new]`` (``"(absent)"`` for a key one side does not have).
``forced`` lists the changed keys that a resume refuses (``FIXED_MID_RUN``) and ``--force``
allowed anyway. ``config.yaml`` is always the config of the newest session; before a resume that
changes it, the previous one is kept as ``config.prev.yaml``, and the history holds every change,
so each session's config can be rebuilt. ``agentrl inspect``, ``replay`` and the training summary
show the history.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

HISTORY_FILE = "history.jsonl"
PREVIOUS_CONFIG = "config.prev.yaml"

ABSENT = "(absent)"
"""What ``changed`` holds for a key one of the two configs does not have (e.g. a method's section)."""
IGNORED = ("run.resume", "run.output_dir")
"""Keys a resume sets itself: never a change."""

FIXED_MID_RUN: dict[str, str] = {
    "model.path": "the checkpoint's weights were trained from this model",
    "model.tokenizer": "the token ids in the checkpoint's optimizer state and the transcripts belong to this tokenizer",
    "model.lora": "the checkpoint was trained with these LoRA settings (rank 0: full fine-tuning, no adapters)",
    "env.name": "the run's tasks and rewards belong to this environment",
    "env.options": "they change the environment's tasks or behaviour",
    "data.source": "the training tasks come from here",
    "data.path": "the training tasks come from here",
    "data.adapter": "it decides what the training tasks are",
    "data.columns": "it decides what the training tasks are",
    "data.train_split": "the training tasks come from here",
    "data.num_train": "the sampler's checkpointed position indexes this task list",
    "data.options": "they decide what the training tasks are",
    "data.test_fraction": "it decides which rows are training tasks",
    "data.split_seed": "it decides which rows are training tasks",
    "run.seed": "the task order is a permutation seeded by run.seed: the checkpoint's position in it means "
    "nothing under another seed",
}
"""Keys (or sections) a resume cannot honour mid-run, and why. ``sft.*`` joins them when either
config warm-starts (the warm start is the model RL started from)."""


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value (a mapping's keys are reached into; lists are values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{key: [old, new]}`` for every leaf that differs between two config trees."""
    a, b = flatten(old), flatten(new)
    return {
        key: [a.get(key, ABSENT), b.get(key, ABSENT)]
        for key in sorted(set(a) | set(b))
        if key not in IGNORED and a.get(key, ABSENT) != b.get(key, ABSENT)
    }


def fixed_reason(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why ``key`` cannot change mid-run (None when it can)."""
    for fixed, why in FIXED_MID_RUN.items():
        if key == fixed or key.startswith(fixed + "."):
            return why
    warm = bool(flatten(old).get("sft.enabled")) or bool(flatten(new).get("sft.enabled"))
    if key.startswith("sft.") and warm:
        return "the SFT warm start is the model RL started from"
    return None


def refused_changes(
    changes: Mapping[str, list[Any]], old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[str]:
    """One message per change a resume cannot honour."""
    out = []
    for key, (was, now) in changes.items():
        why = fixed_reason(key, old, new)
        if why:
            out.append(f"{key}: {_shown(was)} -> {_shown(now)} cannot change mid-run: {why}")
    return out


def append(run_dir: Path, entry: Mapping[str, Any]) -> None:
    """Add one line to the history, flushed to disk (a crash never leaves half a line behind)."""
    line = json.dumps({**entry, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, default=str)
    with open(Path(run_dir) / HISTORY_FILE, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The history's entries, oldest first ([] for a run written before the history existed)."""
    path = Path(run_dir) / HISTORY_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def describe(entries: list[dict[str, Any]]) -> Iterator[str]:
    """One line per start or resume: ``resumed at step 22 (2026-...): trainer.lr 3e-05 -> 1e-05``."""
    for e in entries:
        head = "started" if e.get("event") == "start" else f"{e.get('event', 'resumed')}"
        if head == "resume":
            head = "resumed" + (f" from {e['checkpoint']}" if e.get("checkpoint") else " with no checkpoint")
        changes = "; ".join(f"{k} {_shown(a)} -> {_shown(b)}" for k, (a, b) in e.get("changed", {}).items())
        forced = f" [--force: {', '.join(e['forced'])}]" if e.get("forced") else ""
        yield (
            f"{head} at step {e.get('step', 0)} ({e.get('time', '?')})"
            + (f": {changes}" if changes else "")
            + forced
        )


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
