"""The study's archive: a record of each finished run, small enough to commit, so that a study longer
than one machine's life continues on the next one.

A run directory holds checkpoints and transcripts (gigabytes for a real model) and lives under
``output_dir``, which a fresh machine does not have. When ``archive_dir`` is set, every run that
finishes is copied there as a record of a few hundred kilobytes: ``result.json`` (the held-out
evaluation), ``metrics.jsonl`` (every step's metrics), ``config.yaml`` (the exact config it trained
with) and ``selections.json`` (the per-token counts the report reads from the transcripts), plus the
family's ``prep.json`` (the warm start's H0, H_tgt and held-out accuracy). A study started where its
run directories are missing restores those records first: the runs recorded are not rerun, the
target entropy stays the one the first runs trained against, and the report is the whole study's.

Each record also names the warm start it trained from by the SHA-256 of its weights
(``warm_start_sha256`` in ``result.json``), and the report says whether every run, on whichever
machine it trained, started from the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentrl.study.tokens import SELECTIONS_FILE, Selections

RECORD_FILES = ("result.json", "metrics.jsonl", "config.yaml", SELECTIONS_FILE)
"""What a run's record holds, in the order they are restored (``result.json`` marks a finished run)."""


def record_dir(archive_dir: str, family: str, method: str, seed: int) -> Path:
    return Path(archive_dir) / family / method / f"s{seed}"


def archive_run(archive_dir: str, spec: Any) -> Path:
    """Record the finished run ``spec`` (a ``RunSpec``): its selection counts are written into the run
    directory first (from its transcripts), then the record files are copied. ``result.json`` is
    copied last, so a record interrupted midway is not taken for a finished run."""
    run = Path(spec.out)
    Selections.of_run(run).save(run / SELECTIONS_FILE)
    dest = record_dir(archive_dir, spec.family, spec.method, spec.seed)
    dest.mkdir(parents=True, exist_ok=True)
    for name in sorted(RECORD_FILES, key=lambda n: n == "result.json"):
        if (run / name).exists():
            shutil.copyfile(run / name, dest / name)
    return dest


def restore_runs(archive_dir: str, runs: Sequence[Any], log: Callable[[str], None] = print) -> list[Any]:
    """Copy the record of every run that has a result in the archive and none in its run directory
    into that directory; returns the runs restored. A run directory left by an unfinished run (a
    checkpoint, partial metrics) is replaced: the archive's run finished."""
    restored = []
    for spec in runs:
        src = record_dir(archive_dir, spec.family, spec.method, spec.seed)
        run = Path(spec.out)
        if (run / "result.json").exists() or not (src / "result.json").exists():
            continue
        config = yaml.safe_load((src / "config.yaml").read_text()) if (src / "config.yaml").exists() else {}
        changed = _changed_settings(json.loads((src / "result.json").read_text()), spec, config or {})
        if changed:
            log(
                f"study: the record {src} was trained with other settings than this study gives it "
                f"({'; '.join(changed)}): not used, the run trains again and its record is replaced"
            )
            continue
        if run.exists():
            shutil.rmtree(run)
        run.mkdir(parents=True)
        for name in RECORD_FILES:
            if (src / name).exists():
                shutil.copyfile(src / name, run / name)
        restored.append(spec)
    if restored:
        log(
            f"study: {len(restored)} finished runs restored from the archive {archive_dir}: "
            + ", ".join(f"{s.method} seed {s.seed}" for s in restored)
        )
    return restored


ADDED_SINCE = {"rollout.env_stop": "false"}
"""Settings added after some records were made, with the value those runs had in effect: before
``rollout.env_stop`` (issue 52) no environment's stop condition ended a turn."""


def _changed_settings(recorded: dict[str, Any], spec: Any, config: dict[str, Any] | None = None) -> list[str]:
    """The overrides that differ between a record and the run the study plans now (the target
    entropy, the steps, a method's settings...), as ``key: recorded -> now``. A key the study now
    overrides and the record did not is read from the record's ``config`` (what the run trained
    with), else from ``ADDED_SINCE``."""

    def as_dict(overrides: Sequence[str]) -> dict[str, str]:
        return dict(o.split("=", 1) for o in overrides if "=" in o)

    then, now = as_dict(recorded.get("overrides", [])), as_dict(spec.overrides)
    for key in now.keys() - then.keys():
        value: Any = config or {}
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            value = ADDED_SINCE.get(key)
        if value is not None:
            then[key] = str(value).lower() if isinstance(value, bool) else str(value)
    missing = [n for n in spec.eval_sampling if n not in recorded.get("extra_evals", {})]
    return [
        f"{k}: {then.get(k, '(unset)')} -> {now.get(k, '(unset)')}"
        for k in sorted(then.keys() | now.keys())
        if then.get(k) != now.get(k)
    ] + [f"eval_sampling.{n}: not evaluated" for n in missing]


def archive_prep(archive_dir: str, family: str, prep_file: Path) -> None:
    dest = Path(archive_dir) / family / "prep.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(prep_file, dest)


def restore_prep(archive_dir: str, family: str, prep_file: Path) -> bool:
    """Put the archived ``prep.json`` of ``family`` where the study reads it, unless one is there."""
    src = Path(archive_dir) / family / "prep.json"
    if prep_file.exists() or not src.exists():
        return False
    prep_file.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, prep_file)
    return True


def weights_sha256(model_dir: str | Path) -> str:
    """SHA-256 over a model directory's weight files (``*.safetensors``, ``*.bin``), in name order."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(model_dir).iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors or *.bin weight files")
    for p in files:
        h.update(p.name.encode())
        with p.open("rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def warm_start_lines(prep: dict[str, Any], results: Sequence[dict[str, Any]]) -> list[str]:
    """The report's sentence on where the runs started: the same warm start weights for all, or
    which runs started from other bytes (a warm start rebuilt on another machine that differed)."""
    digests = {r.get("warm_start_sha256") for r in results} - {None}
    expected = prep.get("policy_sha256")
    if not digests:
        return []
    if expected is None and len(digests) == 1:
        return [
            f"Every run started from the same warm start weights (SHA-256 {str(next(iter(digests)))[:12]})."
        ]
    others = [
        f"{r['method']} seed {r['seed']}"
        for r in results
        if r.get("warm_start_sha256") not in (expected, None)
    ]
    if not others:
        return [f"Every run started from the warm start the probe measured (SHA-256 {str(expected)[:12]})."]
    return [
        f"**Runs that started from other warm start weights than the probe's** (SHA-256 "
        f"{str(expected)[:12]}; a warm start rebuilt on another machine that came out different): "
        f"{', '.join(others)}."
    ]
