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

Local paths may contain ``{split}`` (``data/gsm8k_{split}.jsonl``) so one config names both splits;
a hub name may end with ``:config`` (``openai/gsm8k:main``).
The hub is unreachable in this repository's CI: the hub branch is the real ``datasets`` call, and
the tests run every adapter on small local files written in the same schemas (``tests/data``).
"""

from __future__ import annotations

import difflib
import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.env import Task

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(source: str, path: str, split: str = "train", config: str | None = None) -> Any:
    """The rows of a local file (``source="file"``; ``{split}`` in ``path`` is replaced by ``split``)
    or of a hub dataset's ``split`` (``source="hub"``): a list of dicts for JSON files, else a
    ``datasets.Dataset``. A file that cannot be read is a ``ValueError`` naming the file (and, for
    JSON, the line), what was found and what was expected."""
    if source == "hub":  # "openai/gsm8k:main" names the config after a colon
        import datasets  # heavy import, only when data is actually loaded

        name, _, suffix = path.partition(":")
        return datasets.load_dataset(name, config or suffix or None, split=split)
    if source != "file":
        raise ValueError(f"data source must be 'file' or 'hub', got {source!r}")
    file = Path(path.replace("{split}", split))  # the only placeholder: other braces are the file's name
    if file.is_dir():
        raise ValueError(f"{file} is a directory: data.path names a file ({', '.join(_FORMATS)})")
    kind = _FORMATS.get(file.suffix)
    if kind is None:
        raise ValueError(f"cannot tell the format of {file}: use one of {', '.join(_FORMATS)}")
    if not file.exists():
        raise FileNotFoundError(f"dataset file {file} does not exist")
    if kind == "json":
        return read_json_rows(file)
    import datasets

    try:
        return datasets.load_dataset(kind, data_files=str(file), split="train", keep_in_memory=True)
    except Exception as e:  # pyarrow's errors do not name the file
        raise ValueError(f"{file}: cannot be read as {kind}: {type(e).__name__}: {e}") from e


ROW_FORMAT = 'one JSON object per line, e.g. {"prompt": "What is 2+2?", "answer": "4"}'


def read_json_rows(file: Path) -> list[dict[str, Any]]:
    """A ``.jsonl`` file (one object per line) or a ``.json`` file (an array of objects, or JSON
    lines). Errors name the file, the line and what was found there."""
    text = read_utf8(file)
    if file.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{file}, line {e.lineno}: not JSON ({e.msg}); expected an array of objects"
            ) from None
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ValueError(
                    f"{file}: item {i} of the array is {_shown(row)}; expected an object per task"
                )
        return rows
    rows = JsonRows()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{file}, line {n}: not JSON ({e.msg}, column {e.colno}): {line[:80]!r}; expected {ROW_FORMAT}"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{file}, line {n}: {_shown(row)}; expected {ROW_FORMAT}")
        rows.append(row)
        rows.lines.append(n)
    return rows


def read_utf8(file: Path) -> str:
    """``file``'s text as UTF-8; bytes that are not UTF-8 are an error naming the file, the line and
    the column where they start."""
    raw = file.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(
            f"{file}, line {line}, column {column}: not UTF-8 (byte 0x{raw[e.start]:02x}): save the file as UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8)"
        ) from None


class JsonRows(list):
    """Rows read from a JSON-lines file, with the line each came from (``lines[i]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[int] = []


def _shown(value: Any) -> str:
    return f"a JSON {type(value).__name__} {json.dumps(value)[:60]}"


def column_names(rows: Any) -> list[str]:
    """The columns of a ``datasets.Dataset`` or of a list of dicts (every key, in order of appearance)."""
    if hasattr(rows, "column_names"):
        return list(rows.column_names)
    return list(dict.fromkeys(k for row in rows for k in row))


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
    raw = _user_text(_get(row, "prompt"))
    prompt = raw if keep_instructions else _VERL_INSTRUCTIONS.sub("", raw).strip()
    extra = row.get("extra_info") or {}
    extra = extra if isinstance(extra, Mapping) else {}
    source = str(row.get("data_source") or "verl")
    name = re.sub(r"[^a-z0-9]+", "-", source.rsplit("/", 1)[-1].lower()).strip("-") or "verl"
    rid = extra.get("index", index)
    meta = {"data_source": row.get("data_source"), "ability": row.get("ability"), "extra_info": dict(extra),
            "raw_prompt": raw, "source": "verl"}  # fmt: skip
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
    return Task(str(rid), _user_text(_get(row, cols["prompt"])), _get(row, cols["answer"]), meta)


ADAPTERS: dict[str, Adapter] = {
    "gsm8k": gsm8k, "math500": math500, "aime": aime, "dapo_math": dapo_math, "verl": verl,
    "jsonl": generic,
}  # fmt: skip


AIME_SCHEMAS = ({"ID", "Problem", "Solution", "Answer"},)
"""Column sets of published AIME datasets that ``auto`` recognises exactly (case-sensitive); a file
with ``url`` and ``year`` beside problem/answer is AIME 2025's too. Any other question/answer file
is the user's own and gets the neutral ``jsonl`` adapter."""


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
        dapo_prompt = bool(_DAPO_WRAPPER.match(_user_text(first_row.get("prompt"))))
    except (ValueError, TypeError, KeyError):
        dapo_prompt = False
    if "dapo" in source.lower():
        return "dapo_math", f"columns {shown}; data_source {source}"
    if dapo_prompt:
        return "dapo_math", f"columns {shown}; the prompt is DAPO's 'Answer:' template"
    return "verl", f"columns {shown}; data_source {source or '(none)'}"


def _generic_columns(column_names: list[str], columns: Mapping[str, str]) -> dict[str, str]:
    """``columns`` for the generic adapter: a file with ``question`` or ``problem`` (and no
    ``prompt``) uses that column as the prompt."""
    cols = {c.lower(): c for c in column_names}
    if "prompt" in columns or "prompt" in cols:
        return dict(columns)
    for name in ("question", "problem"):
        if name in cols:
            return {"prompt": cols[name], **columns}
    return dict(columns)


@dataclass(frozen=True)
class HeldOut:
    """One set of rows serving both splits (one file without ``{split}``, or a hub dataset whose
    train and test splits are the same): a permutation seeded by ``seed`` puts ``fraction`` of the
    rows (at least one) in ``test`` and the rest in ``train``; ``side`` is the split wanted. Rows of
    ``test`` whose prompt also appears in ``train`` (duplicates in the file) are left out of it."""

    side: str
    fraction: float
    seed: int = 0

    def sides(self, n: int) -> tuple[list[int], list[int]]:
        """The row numbers of (train, test), each in file order."""
        if self.fraction <= 0:
            return list(range(n)), []
        n_test = max(1, round(self.fraction * n))
        if n_test >= n:
            raise ValueError(
                f"{n} row(s) cannot be split into training and held-out rows with data.test_fraction="
                f"{self.fraction:g}: add rows, or give the held-out rows their own file (data.test_path)"
            )
        order = list(range(n))
        random.Random(f"heldout-{self.seed}").shuffle(order)
        return sorted(order[n_test:]), sorted(order[:n_test])


def load_tasks_from_source(source: str, path: str, adapter: str = "auto", columns: Mapping[str, str] | None = None,
                           split: str = "train", n: int | None = None, seed: int = 0, config: str | None = None,
                           held_out: HeldOut | None = None, log: Callable[[str], None] | None = None,
                           **options: Any) -> list[Task]:  # fmt: skip
    """Tasks from a dataset. ``n`` rows are drawn by a seeded shuffle (all rows, in file order, when
    None); ``options`` go to the adapter (e.g. ``keep_instructions`` for ``dapo_math``). With
    ``held_out``, the rows are split first and only its ``side`` is kept (ids keep file row numbers).
    ``log`` gets one line naming the adapter and why it was chosen."""
    columns = dict(columns or {})
    rows = load_rows(source, path, split, config)
    if len(rows) == 0:
        raise ValueError(f"{path} ({split}) has no rows")
    names = column_names(rows)
    name, why = detect_adapter(names, rows[0], columns) if adapter == "auto" else (adapter, "data.adapter")
    if name not in ADAPTERS:
        guess = difflib.get_close_matches(name, list(ADAPTERS), n=1)
        did = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise ValueError(f"unknown adapter {adapter!r}{did}; valid: auto, {', '.join(ADAPTERS)}")
    if name == "jsonl" and adapter == "auto":
        columns = _generic_columns(names, columns)
    fn = ADAPTERS[name]
    _check_options(name, fn, options)
    if log is not None:
        shown = path.replace("{split}", split) if source == "file" else f"{path} ({split})"
        log(f"data: {shown} read as {name} ({why})")
    lines = getattr(rows, "lines", None)
    where = (lambda i: f"{path}, line {lines[i]}") if lines else (lambda i: f"{path} ({split}), row {i}")

    def task(i: int, label: str) -> Task:
        return _row_task(fn, rows, i, label, columns, options, where)

    index, label = list(range(len(rows))), split
    if held_out is not None:
        label = held_out.side
        train, test = held_out.sides(len(rows))
        if held_out.side == "test":
            seen = {task(i, "train").prompt for i in train}
            test = [i for i in test if task(i, "test").prompt not in seen]
        index = test if held_out.side == "test" else train
    if n is not None and n < len(index):  # row numbers stay those of the file: ids do not depend on n
        index = random.Random(seed).sample(index, n)
    tasks = [task(i, label) for i in index]
    if log is not None:
        for line in row_warnings(tasks, [where(i) for i in index]):
            log(line)
    return tasks


def row_warnings(tasks: list[Task], where: list[str]) -> list[str]:
    """What looks wrong in a file's tasks (``where[i]`` names task i's line), with counts and
    examples: ids that repeat (each repeat trains as a task of its own, and transcripts, evaluation
    and ``replay --episode`` cannot tell them apart) and empty answers (a reward that compares with
    ``task.answer`` then pays for no answer)."""
    out = []
    seen: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        seen.setdefault(t.id, []).append(i)
    repeated = {k: v for k, v in seen.items() if len(v) > 1}
    if repeated:
        tid, rows = next(iter(repeated.items()))
        out.append(
            f"warning: data: {len(repeated)} task id(s) appear more than once (e.g. {tid!r} at "
            f"{' and '.join(where[i] for i in rows[:2])}): each repeat trains as a task of its own and "
            "transcripts cannot tell them apart; give every row its own id (or drop the id column)"
        )
    empty = [i for i, t in enumerate(tasks) if isinstance(t.answer, str) and not t.answer.strip()]
    if empty:
        shown = ", ".join(where[i] for i in empty[:3])
        out.append(
            f"warning: data: {len(empty)} of {len(tasks)} task(s) have an empty answer ({shown}): a reward "
            "that compares with task.answer pays for no answer there; fill them in or drop those rows"
        )
    return out


def _check_options(name: str, fn: Adapter, options: Mapping[str, Any]) -> None:
    """``options`` must be keyword arguments of the adapter (``data.options``)."""
    import inspect

    takes = [p for p in list(inspect.signature(fn).parameters)[4:]]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        offer = f"it takes {', '.join(takes)}" if takes else "it takes none"
        raise ValueError(
            f"data.options {unknown} do not apply to the {name!r} dataset adapter ({offer}); an environment's "
            "task-generator knobs (data.options of a built-in environment) do not apply to a data file: "
            "remove them (data.options={} clears them)"
        )


def _row_task(
    fn: Adapter,
    rows: Any,
    i: int,
    split: str,
    columns: Mapping[str, str],
    options: Mapping[str, Any],
    where: Callable[[int], str],
) -> Task:
    """One row through its adapter; a row the adapter cannot read is named by file and line."""
    try:
        task = fn(rows[i], i, split, columns, **options)
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise ValueError(f"{where(i)}: {msg}") from e
    if not isinstance(task.prompt, str) or not task.prompt.strip() or task.prompt == "None":
        raise ValueError(f"{where(i)}: the prompt is empty or missing ({rows[i]!r:.120})")
    if task.answer is None:
        raise ValueError(f"{where(i)}: the answer is missing (null) ({rows[i]!r:.120})")
    return task


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
        """Restore a checkpoint's position. A position past the end of this task list (a resume
        with ``--force`` onto fewer tasks) starts the next epoch."""
        self.epoch, self.pos = state["epoch"], state["pos"]
        if self.pos > len(self.tasks):
            self.epoch, self.pos = self.epoch + 1, 0
        self._order = self._perm()
