"""Dataset adapters: one dataset row -> ``Task(id, prompt, answer, metadata)``.

An adapter maps each row (``rows``) to a task. Adapters and their column mappings
(``task field <- dataset column``):

============  ===========================================================================================
adapter       mapping
============  ===========================================================================================
``gsm8k``     prompt <- ``question``; answer <- the text after ``####`` in ``answer`` (commas dropped);
              metadata.solution <- ``answer``; id ``gsm8k-{split}-{row}``
``math500``   prompt <- ``problem``; answer <- ``answer``; metadata <- ``solution``, ``subject``, ``level``;
              id <- ``unique_id``
``aime``      AIME 2024/2025 variants, columns matched case-insensitively: prompt <- ``problem`` or
              ``question``; answer <- ``answer`` (as an integer string, ``"033"`` -> ``"33"``);
              metadata <- ``solution``, ``url``, ``year`` when present; id <- ``id`` or the row number
``dapo_math`` DAPO-Math-17k: prompt <- the user message of ``prompt`` (a chat list) with DAPO's
              "Answer:" instructions stripped (option ``keep_instructions=True`` keeps them); answer <-
              ``reward_model.ground_truth``; metadata <- ``data_source``, ``ability``, ``extra_info``;
              id <- ``extra_info.index``
``verl``      a verl preprocessed parquet (``examples/data_preprocess/*.py``: gsm8k, math, ...): prompt <- the
              user message of ``prompt`` with verl's answer instruction stripped (``... output the final
              answer after "####".`` / ``... within \\boxed{}.``): the environment's system prompt gives
              the one answer format (``\\boxed{}``) and its reward reads it; answer <-
              ``reward_model.ground_truth``; metadata <- ``data_source``, ``ability``, ``extra_info``,
              ``raw_prompt``, ``solution`` <- ``extra_info.answer``; id ``verl-{data_source name}-{split}-{index}``
``jsonl``     generic: ``columns`` maps ``id``/``prompt``/``answer`` to column names (dotted paths reach
              into nested columns: ``reward_model.ground_truth``); defaults ``id``, ``prompt``,
              ``answer``; a chat-list prompt becomes its last user message; other columns -> metadata
``auto``      picks one of the above from the column names (``columns`` given -> ``jsonl``); ``prompt`` +
              ``reward_model`` is ``dapo_math`` when ``data_source`` names DAPO or the prompt is DAPO's
              template, else ``verl``. ``load_tasks_from_source(log=...)`` says which and why
============  ===========================================================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from agentrl.env import Task

Adapter = Callable[..., Task]
"""``adapter(row, index, split, columns, **options) -> Task``."""


def _get(row: Mapping[str, Any], path: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"``; KeyError names the missing part."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(f"column {path!r} not found (row has {sorted(row)})")
        value = value[part]
    return value


def _ci(row: Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` present in ``row``, matched case-insensitively; None if absent."""
    lower = {k.lower(): k for k in row}
    for n in names:
        if n in lower:
            return row[lower[n]]
    return None


def _no_columns(adapter: str, columns: Mapping[str, str]) -> None:
    if columns:
        raise ValueError(f"`columns` applies to the 'jsonl' adapter, not to {adapter!r}")


def user_text(prompt: Any) -> str:
    """A chat-list prompt's last user message; a string stays as it is."""
    if isinstance(prompt, list):
        users = [m["content"] for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if not users:
            raise ValueError("the chat-list prompt has no user message")
        return str(users[-1])
    return str(prompt)


def _int_string(answer: Any) -> str:
    s = str(answer).strip()
    return str(int(s)) if re.fullmatch(r"[-+]?\d+", s) else s


def gsm8k(row: Mapping[str, Any], index: int, split: str, columns: Mapping[str, str]) -> Task:
    _no_columns("gsm8k", columns)
    solution = str(_get(row, "answer"))
    m = re.search(r"####\s*(.+?)\s*$", solution)
    if not m:
        raise ValueError(f"gsm8k row {index}: no '#### answer' line in {solution[-80:]!r}")
    answer = m.group(1).replace(",", "").strip()
    return Task(
        f"gsm8k-{split}-{index}",
        str(_get(row, "question")),
        answer,
        {"solution": solution, "source": "gsm8k"},
    )


def math500(row: Mapping[str, Any], index: int, split: str, columns: Mapping[str, str]) -> Task:
    _no_columns("math500", columns)
    meta = {k: row[k] for k in ("solution", "subject", "level") if k in row}
    uid = row.get("unique_id") or f"math-{split}-{index}"
    return Task(
        str(uid), str(_get(row, "problem")), str(_get(row, "answer")).strip(), {**meta, "source": "math500"}
    )


def aime(row: Mapping[str, Any], index: int, split: str, columns: Mapping[str, str]) -> Task:
    _no_columns("aime", columns)
    problem, answer = _ci(row, "problem", "question"), _ci(row, "answer")
    if problem is None or answer is None:
        raise KeyError(f"aime row {index}: needs problem/question and answer columns, has {sorted(row)}")
    meta = {k: v for k in ("solution", "url", "year") if (v := _ci(row, k)) is not None}
    rid = _ci(row, "id")
    return Task(
        f"aime-{rid if rid is not None else index}",
        str(problem),
        _int_string(answer),
        {**meta, "source": "aime"},
    )


DAPO_WRAPPER = re.compile(
    r"^Solve the following math problem.*?\n\n(?P<problem>.*)\n\nRemember to put your answer.*$", re.S
)


def dapo_math(
    row: Mapping[str, Any],
    index: int,
    split: str,
    columns: Mapping[str, str],
    keep_instructions: bool = False,
) -> Task:
    _no_columns("dapo_math", columns)
    raw = user_text(_get(row, "prompt"))
    m = DAPO_WRAPPER.match(raw)
    prompt = raw if keep_instructions or not m else m.group("problem").strip()
    extra = row.get("extra_info") or {}
    rid = extra.get("index") if isinstance(extra, Mapping) else None
    meta = {
        "data_source": row.get("data_source"),
        "ability": row.get("ability"),
        "extra_info": extra,
        "raw_prompt": raw,
        "source": "dapo_math",
    }
    return Task(
        f"dapo-{rid if rid is not None else index}",
        prompt,
        str(_get(row, "reward_model.ground_truth")).strip(),
        meta,
    )


_VERL_INSTRUCTIONS = re.compile(
    r"\s*Let's think step by step and output the final answer "
    r"(?:after \"####\"|within \\boxed\{\})\.?\s*$"
)
"""verl's own answer instructions, appended to the question by its preprocessing scripts (gsm8k.py:
'after "####"'; math_dataset.py: 'within \\boxed{}')."""


def verl(
    row: Mapping[str, Any],
    index: int,
    split: str,
    columns: Mapping[str, str],
    keep_instructions: bool = False,
) -> Task:
    """A verl parquet row. verl's answer instruction is stripped: the environment's prompt gives the
    one answer format (``\\boxed{}``) its reward reads; ``keep_instructions=True`` keeps it."""
    _no_columns("verl", columns)
    raw = user_text(_get(row, "prompt"))
    prompt = raw if keep_instructions else _VERL_INSTRUCTIONS.sub("", raw).strip()
    extra = row.get("extra_info") or {}
    extra = extra if isinstance(extra, Mapping) else {}
    source = str(row.get("data_source") or "verl")
    name = re.sub(r"[^a-z0-9]+", "-", source.rsplit("/", 1)[-1].lower()).strip("-") or "verl"
    rid = extra.get("index", index)
    meta = {
        "data_source": row.get("data_source"),
        "ability": row.get("ability"),
        "extra_info": dict(extra),
        "raw_prompt": raw,
        "source": "verl",
    }
    if extra.get("answer"):
        meta["solution"] = str(extra["answer"])  # GSM8K's worked solution: the SFT warm start's demo
    return Task(
        f"verl-{name}-{extra.get('split') or split}-{rid}",
        prompt,
        str(_get(row, "reward_model.ground_truth")).strip(),
        meta,
    )


def generic(row: Mapping[str, Any], index: int, split: str, columns: Mapping[str, str]) -> Task:
    unknown = set(columns) - {"id", "prompt", "answer"}
    if unknown:
        raise ValueError(f"columns maps task fields id/prompt/answer; unknown field(s) {sorted(unknown)}")
    cols = {"id": "id", "prompt": "prompt", "answer": "answer", **columns}
    used = {c.split(".")[0] for c in cols.values()}
    rid = _get(row, cols["id"]) if cols["id"].split(".")[0] in row else f"{split}-{index}"
    meta = {k: v for k, v in row.items() if k not in used}
    return Task(str(rid), user_text(_get(row, cols["prompt"])), _get(row, cols["answer"]), meta)


ADAPTERS: dict[str, Adapter] = {
    "gsm8k": gsm8k,
    "math500": math500,
    "aime": aime,
    "dapo_math": dapo_math,
    "verl": verl,
    "jsonl": generic,
}
