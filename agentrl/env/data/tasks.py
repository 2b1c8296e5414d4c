"""Tasks from a dataset: its rows (``rows``) through an adapter (``adapters``, or the one ``auto``
picks: ``detect``), optionally one side of a held-out split (``heldout``), with a warning for what
looks wrong in them (repeated ids, empty answers).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from agentrl.env import Task
from agentrl.env.data.adapters import ADAPTERS, Adapter
from agentrl.env.data.detect import resolve_adapter
from agentrl.env.data.heldout import HeldOut
from agentrl.env.data.rows import column_names, load_rows


def load_tasks_from_source(
    source: str,
    path: str,
    adapter: str = "auto",
    columns: Mapping[str, str] | None = None,
    split: str = "train",
    n: int | None = None,
    seed: int = 0,
    config: str | None = None,
    held_out: HeldOut | None = None,
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> list[Task]:
    """Tasks from a dataset. ``n`` rows are drawn by a seeded shuffle (all rows, in file order, when
    None); ``options`` go to the adapter (e.g. ``keep_instructions`` for ``dapo_math``). With
    ``held_out``, the rows are split first and only its ``side`` is kept (ids keep file row numbers).
    ``log`` gets one line naming the adapter and why it was chosen."""
    columns = dict(columns or {})
    rows = load_rows(source, path, split, config)
    if len(rows) == 0:
        raise ValueError(f"{path} ({split}) has no rows")
    name, why, columns = resolve_adapter(adapter, column_names(rows), rows[0], columns)
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
