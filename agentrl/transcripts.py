"""Write and read transcripts: one Episode JSON line per episode, appended per training step.

The file is append-only and crash-safe: each step's episodes go out in one write followed by flush and
fsync, so a kill can at worst leave a torn *last* line, which readers skip with a warning. Readers
stream line by line and never hold more than one episode in memory, so a 100k-episode file can be
searched for one id. The format (episode fields plus the trainer's per-token overlays) is documented
in docs/transcripts.md as transcript format version 1.

Also here: the ``--filter`` mini language (``reward<0.5,stop_reason=max_turns,failure=tool``, parsed
by hand, never evaluated) and small run-directory helpers shared by replay, inspect and doctor.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.episode import Episode, decode_floats

FORMAT_VERSION = 1
OVERLAY_KEYS: tuple[str, ...] = (
    "logp_old",
    "logp_new",
    "entropy",
    "advantage",
    "weight",
    "selected",
    "clipped",
)
"""Overlay lists the trainer attaches per token (format version 1); readers tolerate missing keys."""
TRANSCRIPTS_FILE, METRICS_FILE, CONFIG_FILE = "transcripts.jsonl", "metrics.jsonl", "config.yaml"


class TranscriptWarning(UserWarning):
    """A line of a transcript or metrics file was skipped (torn by a crash, or not JSON)."""


# -- writing ------------------------------------------------------------------------------------
class TranscriptWriter:
    """Append episodes to a JSONL file; each ``write`` is one write + flush + fsync."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab")  # noqa: SIM115  (closed by close() / __exit__)
        # A crash may have left a torn last line: end it so our first line starts clean. The torn
        # bytes stay (we never destroy data) and the reader skips them with a warning.
        if self._f.tell() > 0 and _last_byte(self.path) != b"\n":
            self._f.write(b"\n")

    def write(self, episodes: Iterable[Episode]) -> int:
        """Append episodes (one line each) durably; returns how many were written."""
        lines = [ep.to_json().encode("utf-8") + b"\n" for ep in episodes]
        if lines:
            self._f.write(b"".join(lines))
            self._f.flush()
            os.fsync(self._f.fileno())
        return len(lines)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


# -- reading ------------------------------------------------------------------------------------
def iter_json_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """(byte offset, raw line) for every non-empty line, streamed."""
    with open(path, "rb") as f:
        offset = 0
        for raw in f:
            if raw.strip():
                yield offset, raw
            offset += len(raw)


def _loads(raw: bytes, path: Any, offset: int) -> dict[str, Any] | None:
    """Parse one line; a bad line becomes a warning and None (a torn last line is expected)."""
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        return obj
    except ValueError as e:
        torn = not raw.endswith(b"\n")
        what = "torn last line" if torn else "unreadable line"
        warnings.warn(
            f"{path}: skipping {what} at byte {offset} ({len(raw)} bytes: {e})",
            TranscriptWarning,
            stacklevel=3,
        )
        return None


def iter_records(
    path: str | os.PathLike[str], step: int | None = None, episode: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(offset, decoded episode dict) for matching lines, cheap prefilters before parsing."""
    step_re = re.compile(rb'"step":\s*' + str(step).encode() + rb"\s*[,}]") if step is not None else None
    id_needles = _id_needles(episode) if episode is not None else ()
    for offset, raw in iter_json_lines(path):
        if id_needles and not any(n in raw for n in id_needles):
            continue
        if step_re is not None and not step_re.search(raw):
            continue
        obj = _loads(raw, path, offset)
        if obj is None:
            continue
        if episode is not None and obj.get("id") != episode:
            continue
        if step is not None and obj.get("step") != step:
            continue
        # Non-finite floats are tagged objects (see episode.py); most lines have none: skip the walk.
        yield offset, (decode_floats(obj) if b"__float__" in raw else obj)


def _id_needles(episode_id: str) -> tuple[bytes, ...]:
    # The id as it appears inside the JSON string, with and without ASCII escaping.
    return tuple({json.dumps(episode_id, ensure_ascii=a)[1:-1].encode() for a in (False, True)})


def iter_episodes(
    path: str | os.PathLike[str],
    step: int | None = None,
    episode: str | None = None,
    filter: str | Callable[[Episode], bool] | None = None,
) -> Iterator[Episode]:
    """Stream episodes from a transcript file (or a run directory), optionally only one step, one
    episode id, or those matching a filter expression (see ``parse_filter``)."""
    pred = parse_filter(filter) if isinstance(filter, str) else filter
    for _, d in iter_records(transcripts_path(path), step=step, episode=episode):
        ep = Episode.from_dict(d)
        if pred is None or pred(ep):
            yield ep


def read_episode_at(path: str | os.PathLike[str], offset: int) -> Episode:
    """The episode whose line starts at ``offset`` (from ``iter_records``): random access."""
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.readline()
    d = json.loads(raw)
    return Episode.from_dict(decode_floats(d) if b"__float__" in raw else d)


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (torn lines skipped with a warning); [] when absent."""
    p = Path(path)
    if p.is_dir():
        p = p / METRICS_FILE
    if not p.exists():
        return []
    return [d for off, raw in iter_json_lines(p) if (d := _loads(raw, p, off)) is not None]


# -- run directories ----------------------------------------------------------------------------
def transcripts_path(path: str | os.PathLike[str]) -> Path:
    """Accept a run directory or a transcript file."""
    p = Path(path)
    return p / TRANSCRIPTS_FILE if p.is_dir() else p


def run_dir_of(path: str | os.PathLike[str]) -> Path | None:
    """The run directory a path belongs to (it holds config.yaml), if any."""
    p = Path(path).resolve()
    for d in (p, p.parent):
        if d.is_dir() and (d / CONFIG_FILE).exists():
            return d
    return None


def load_run_config(run_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The resolved config.yaml as plain dicts ({} when there is none)."""
    if run_dir is None or not (Path(run_dir) / CONFIG_FILE).exists():
        return {}
    import yaml

    with open(Path(run_dir) / CONFIG_FILE) as f:
        cfg = yaml.safe_load(f)
    return cfg if isinstance(cfg, dict) else {}


_CLAUSE = re.compile(r"^\s*([A-Za-z_][\w./-]*)\s*(<=|>=|!=|=|<|>|~)\s*(.*?)\s*$")
_NUMERIC_OPS = {"<": float.__lt__, "<=": float.__le__, ">": float.__gt__, ">=": float.__ge__}
FILTER_KEYS = (
    "id", "env", "task", "group", "stop_reason", "failure", "step", "seed", "reward", "turns", "tokens",
    "policy_tokens", "reward.NAME", "metrics.NAME",
)  # fmt: skip


@dataclass(frozen=True)
class Clause:
    key: str
    op: str
    value: str

    def __call__(self, ep: Episode) -> bool:
        return _compare(episode_field(ep, self.key), self.op, self.value)


def parse_filter(expr: str | None) -> Callable[[Episode], bool] | None:
    """Parse ``key OP value[,key OP value...]`` (all clauses must hold). OP is one of = != < <= > >=
    and ~ (substring). Keys: see ``FILTER_KEYS``; ``failure`` is a boundary name, ``none`` or
    ``any``. Values are numbers or bare strings; ``none`` matches a missing value."""
    if expr is None or not expr.strip():
        return None
    clauses = []
    for part in expr.split(","):
        m = _CLAUSE.match(part)
        if not m:
            raise ValueError(f"bad filter clause {part!r}: expected KEY OP VALUE with OP in = != < <= > >= ~")
        key, op, value = m.groups()
        if not value or value[0] in "=<>!~":
            raise ValueError(f"bad filter clause {part!r}: missing value, or a doubled operator")
        key = {"stop": "stop_reason", "task_id": "task", "length": "tokens"}.get(key, key)
        base = key.split(".", 1)[0]
        if key not in FILTER_KEYS and base not in ("reward", "metrics"):
            raise ValueError(f"unknown filter key {key!r}; known: {', '.join(FILTER_KEYS)}")
        clauses.append(Clause(key, op, value))
    return lambda ep: all(c(ep) for c in clauses)


def episode_field(ep: Episode, key: str) -> Any:
    """The value a filter key names on an episode."""
    if key.startswith("reward."):
        return ep.reward_components.get(key[7:])
    if key.startswith("metrics."):
        return ep.metrics.get(key[8:])
    if key == "failure":
        return ep.failure.boundary if ep.failure else None
    simple: dict[str, Callable[[Episode], Any]] = {
        "id": lambda e: e.id, "env": lambda e: e.env, "task": lambda e: e.task_id, "group": lambda e: e.group,
        "stop_reason": lambda e: e.stop_reason, "step": lambda e: e.step, "seed": lambda e: e.seed,
        "reward": lambda e: e.reward, "turns": lambda e: e.num_turns, "tokens": lambda e: len(e.token_ids()),
        "policy_tokens": lambda e: e.num_policy_tokens,
    }  # fmt: skip
    return simple[key](ep)


def _as_float(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _compare(actual: Any, op: str, value: str) -> bool:
    if value.lower() == "any" and op in ("=", "!="):
        return (actual is not None) == (op == "=")
    if value.lower() in ("none", "null") and op in ("=", "!="):
        return (actual is None) == (op == "=")
    if op in _NUMERIC_OPS:
        a, v = _as_float(actual), _as_float(value)
        if v is None:
            raise ValueError(f"filter {op} needs a number, got {value!r}")
        return a is not None and _NUMERIC_OPS[op](a, v)
    if actual is None:
        return op == "!="
    if op == "~":
        return value in str(actual)
    a, v = _as_float(actual), _as_float(value)
    equal = a == v if a is not None and v is not None else str(actual) == value
    return equal if op == "=" else not equal
