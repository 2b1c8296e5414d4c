"""Dataset adapters: rows of a local file or a hub dataset -> ``Task(id, prompt, answer, metadata)``.

Rows are read with ``datasets`` (``load_dataset("json"|"parquet"|"csv", data_files=...)`` for local
files, ``load_dataset(name, config, split=...)`` for the hub), then an adapter maps each row to a
task. Adapters and their column mappings (``task field <- dataset column``):

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
``jsonl``     generic: ``columns`` maps ``id``/``prompt``/``answer`` to column names (dotted paths reach
              into nested columns: ``reward_model.ground_truth``); defaults ``id``, ``prompt``,
              ``answer``; a chat-list prompt becomes its last user message; other columns -> metadata
``auto``      picks one of the above from the column names (``columns`` given -> ``jsonl``)
============  ===========================================================================================

Local paths may contain ``{split}`` (``data/gsm8k_{split}.jsonl``) so one config names both splits;
a hub name may end with ``:config`` (``openai/gsm8k:main``).
The hub is unreachable in this repository's CI: the hub branch is the real ``datasets`` call, and
the tests run every adapter on small local files written in the same schemas (``tests/data``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.env import Task

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(source: str, path: str, split: str = "train", config: str | None = None) -> Any:
    """A ``datasets.Dataset`` from a local file (``source="file"``) or a hub name (``source="hub"``)."""
    import datasets  # heavy import, only when data is actually loaded

    if source == "hub":  # "openai/gsm8k:main" names the config after a colon
        name, _, suffix = path.partition(":")
        return datasets.load_dataset(name, config or suffix or None, split=split)
    if source != "file":
        raise ValueError(f"data source must be 'file' or 'hub', got {source!r}")
    file = Path(path.format(split=split))
    kind = _FORMATS.get(file.suffix)
    if kind is None:
        raise ValueError(f"cannot tell the format of {file}: use one of {', '.join(_FORMATS)}")
    if not file.exists():
        raise FileNotFoundError(f"dataset file {file} does not exist")
    return datasets.load_dataset(kind, data_files=str(file), split="train", keep_in_memory=True)


# -- adapters -------------------------------------------------------------------------------------
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


def _user_text(prompt: Any) -> str:
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


_DAPO_WRAPPER = re.compile(
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
    raw = _user_text(_get(row, "prompt"))
    m = _DAPO_WRAPPER.match(raw)
    prompt = raw if keep_instructions or not m else m.group("problem").strip()
    extra = row.get("extra_info") or {}
    rid = extra.get("index") if isinstance(extra, Mapping) else None
    meta = {"data_source": row.get("data_source"), "ability": row.get("ability"), "extra_info": extra,
            "raw_prompt": raw, "source": "dapo_math"}  # fmt: skip
    return Task(
        f"dapo-{rid if rid is not None else index}",
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
    return Task(str(rid), _user_text(_get(row, cols["prompt"])), _get(row, cols["answer"]), meta)


ADAPTERS: dict[str, Adapter] = {
    "gsm8k": gsm8k, "math500": math500, "aime": aime, "dapo_math": dapo_math, "jsonl": generic,
}  # fmt: skip


def detect_adapter(column_names: list[str], first_row: Mapping[str, Any], columns: Mapping[str, str]) -> str:
    """The adapter for ``auto``, from the column names (and GSM8K's ``####`` answers)."""
    cols = {c.lower() for c in column_names}
    if columns:
        return "jsonl"
    if {"prompt", "reward_model"} <= cols:
        return "dapo_math"
    if {"question", "answer"} <= cols and "####" in str(first_row.get("answer", "")):
        return "gsm8k"
    if {"problem", "answer"} <= cols and ("unique_id" in cols or {"subject", "level"} <= cols):
        return "math500"
    if ({"problem", "answer"} <= cols or {"question", "answer"} <= cols) and "prompt" not in cols:
        return "aime"
    if {"prompt", "answer"} <= cols:
        return "jsonl"
    raise ValueError(
        f"cannot pick an adapter for columns {sorted(column_names)}; set data.adapter and data.columns"
    )


def load_tasks_from_source(source: str, path: str, adapter: str = "auto", columns: Mapping[str, str] | None = None,
                           split: str = "train", n: int | None = None, seed: int = 0, config: str | None = None,
                           **options: Any) -> list[Task]:  # fmt: skip
    """Tasks from a dataset. ``n`` rows are drawn by a seeded shuffle (all rows, in file order, when
    None); ``options`` go to the adapter (e.g. ``keep_instructions`` for ``dapo_math``)."""
    columns = dict(columns or {})
    rows = load_rows(source, path, split, config)
    if len(rows) == 0:
        raise ValueError(f"{path} ({split}) has no rows")
    index = list(range(len(rows)))
    if n is not None and n < len(rows):  # row numbers stay those of the file: ids do not depend on n
        index = random.Random(seed).sample(index, n)
    name = detect_adapter(rows.column_names, rows[0], columns) if adapter == "auto" else adapter
    if name not in ADAPTERS:
        raise ValueError(f"unknown adapter {adapter!r}; valid: auto, {', '.join(ADAPTERS)}")
    fn = ADAPTERS[name]
    return [fn(rows[i], i, split, columns, **options) for i in index]


# -- task sampling ------------------------------------------------------------------------------
class TaskSampler:
    """Epochs over the task list in a seeded order; its position is checkpointed."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks, self.seed = list(tasks), seed
        self.epoch, self.pos = 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self, n: int) -> list[Task]:
        out: list[Task] = []
        while len(out) < n:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._perm()
