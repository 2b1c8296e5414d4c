"""The ``auto`` adapter: which adapter (``adapters.ADAPTERS``) a dataset's columns call for, and why
(the line ``load_tasks_from_source(log=...)`` writes)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from agentrl.env.data.adapters import ADAPTERS, DAPO_WRAPPER, user_text

AIME_SCHEMAS = ({"ID", "Problem", "Solution", "Answer"},)
"""Column sets of published AIME datasets that ``auto`` recognises exactly (case-sensitive); a file
with ``url`` and ``year`` beside problem/answer is AIME 2025's too. Any other question/answer file
is the user's own and gets the neutral ``jsonl`` adapter."""


def resolve_adapter(
    adapter: str, column_names: list[str], first_row: Mapping[str, Any], columns: Mapping[str, str]
) -> tuple[str, str, dict[str, str]]:
    """The adapter named by ``data.adapter`` (``auto``: the one ``detect_adapter`` picks), why, and
    the ``columns`` it gets (the generic adapter picked by ``auto`` may take its prompt column from
    ``question`` or ``problem``). An unknown name is an error offering the closest one."""
    auto = adapter == "auto"
    name, why = detect_adapter(column_names, first_row, columns) if auto else (adapter, "data.adapter")
    if name not in ADAPTERS:
        guess = difflib.get_close_matches(name, list(ADAPTERS), n=1)
        did = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise ValueError(f"unknown adapter {adapter!r}{did}; valid: auto, {', '.join(ADAPTERS)}")
    if name == "jsonl" and auto:
        return name, why, generic_columns(column_names, columns)
    return name, why, dict(columns)


def detect_adapter(
    column_names: list[str], first_row: Mapping[str, Any], columns: Mapping[str, str]
) -> tuple[str, str]:
    """The adapter for ``auto`` and why (for the log), from the column names (and GSM8K's ``####``
    answers, a verl file's ``data_source``). A file that matches no published schema gets the generic
    ``jsonl`` adapter: ids ``{split}-{row}``, and unmapped columns as metadata."""
    cols = {c.lower() for c in column_names}
    if columns:
        return "jsonl", "data.columns given"
    if {"prompt", "reward_model"} <= cols:
        return _verl_family(column_names, first_row)
    if {"question", "answer"} <= cols and "####" in str(first_row.get("answer", "")):
        return "gsm8k", "columns question, answer; the answer has a '####' line"
    if {"problem", "answer"} <= cols and ("unique_id" in cols or {"subject", "level"} <= cols):
        return "math500", "columns problem, answer, " + (
            "unique_id" if "unique_id" in cols else "subject, level"
        )
    if set(column_names) in AIME_SCHEMAS or ({"problem", "answer", "url", "year"} <= cols):
        return "aime", f"columns {', '.join(sorted(column_names))}: an AIME dataset's"
    for name in ("prompt", "question", "problem"):
        if {name, "answer"} <= cols:
            return "jsonl", f"columns {name}, answer: no published schema matches, the generic adapter"
    raise ValueError(
        f"cannot pick an adapter for columns {sorted(column_names)}: a task needs a prompt and an answer. "
        "Name the columns with data.columns (e.g. {prompt: my_question, answer: my_answer}), or set data.adapter"
    )


def _verl_family(column_names: list[str], first_row: Mapping[str, Any]) -> tuple[str, str]:
    """A verl-format row (``prompt`` chat list, ``reward_model.ground_truth``): ``dapo_math`` when
    its ``data_source`` names DAPO (``math_dapo``) or its prompt is DAPO's "Answer:" template, else
    ``verl`` (gsm8k, math and the other files of verl's preprocessing scripts)."""
    shown = ", ".join(c for c in ("prompt", "reward_model", "extra_info") if c in column_names)
    source = str(first_row.get("data_source") or "")
    try:
        dapo_prompt = bool(DAPO_WRAPPER.match(user_text(first_row.get("prompt"))))
    except (ValueError, TypeError, KeyError):
        dapo_prompt = False
    if "dapo" in source.lower():
        return "dapo_math", f"columns {shown}; data_source {source}"
    if dapo_prompt:
        return "dapo_math", f"columns {shown}; the prompt is DAPO's 'Answer:' template"
    return "verl", f"columns {shown}; data_source {source or '(none)'}"


def generic_columns(column_names: list[str], columns: Mapping[str, str]) -> dict[str, str]:
    """``columns`` for the generic adapter: a file with ``question`` or ``problem`` (and no
    ``prompt``) uses that column as the prompt."""
    cols = {c.lower(): c for c in column_names}
    if "prompt" in columns or "prompt" in cols:
        return dict(columns)
    for name in ("question", "problem"):
        if name in cols:
            return {"prompt": cols[name], **columns}
    return dict(columns)
