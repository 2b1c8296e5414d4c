"""A dataset's rows: a local file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``) or a hub dataset's
split, read with ``datasets`` (``load_dataset("json"|"parquet"|"csv", data_files=...)`` for local
files, ``load_dataset(name, config, split=...)`` for the hub); JSON files are read here, so an error
names the file and the line.

Local paths may contain ``{split}`` (``data/gsm8k_{split}.jsonl``) so one config names both splits;
a hub name may end with ``:config`` (``openai/gsm8k:main``).
The hub is unreachable in this repository's CI: the hub branch is the real ``datasets`` call, and
the tests run every adapter on small local files written in the same schemas (``tests/data``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
