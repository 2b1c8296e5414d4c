"""``agentrl inspect``: one self-contained HTML page for a run (no network, no CDN).

The page holds the run's curves, a filterable table of episodes and an episode view that shows every
token with switchable overlays (role/mask, surprisal, entropy, advantage × weight, selection), so a user
can go from a curve to "why did this token get this weight". The page is built from
``agentrl/views/viewer/{template.html,viewer.css,viewer.js}`` with the data embedded as JSON.

Large runs: the transcript is streamed twice (a light index of every episode, then the kept ones by
byte offset). At most ``max_episodes`` episodes are embedded: every failed episode (up to half the
budget), the rest sampled evenly within each step. Curves and per-step aggregates use every episode.
The table is paginated and only the open episode's tokens are in the DOM; the page says what it kept.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from agentrl.config import run_history
from agentrl.episode import Episode
from agentrl.training.metrics import CURVES, IMPORTANT
from agentrl.transcripts import (
    OVERLAY_KEYS,
    TranscriptWarning,
    iter_records,
    load_run_config,
    read_episode_at,
    read_metrics,
    run_dir_of,
    transcripts_path,
)
from agentrl.views.replay import sample_break_title
from agentrl.views.run_tokenizer import first_tokenizer, tokenizer_candidates


# -- index and sampling -------------------------------------------------------------------------
def summarize(d: dict[str, Any], offset: int) -> dict[str, Any]:
    """The table row of one episode (from its decoded JSON, without building the Episode)."""
    segs = d.get("segments") or []
    ov = d.get("overlays") or {}
    ent = [x for x in (ov.get("entropy") or []) if x is not None]
    sel = ov.get("selected") or []
    failure = d.get("failure") or None
    return {
        "id": d.get("id"),
        "step": d.get("step"),
        "env": d.get("env"),
        "task": d.get("task_id"),
        "group": d.get("group"),
        "reward": d.get("reward"),
        "stop": d.get("stop_reason"),
        "failure": failure["boundary"] if failure else None,
        "failure_msg": failure["message"] if failure else None,
        "turns": sum(1 for s in segs if s.get("role") == "policy"),
        "tokens": sum(len(s.get("token_ids") or []) for s in segs),
        "policy_tokens": sum(len(s.get("token_ids") or []) for s in segs if s.get("role") == "policy"),
        "entropy": _r(sum(ent) / len(ent)) if ent else None,
        "selected": sum(1 for x in sel if x),
        "weighting": (d.get("metrics") or {}).get("weighting"),
        "components": d.get("reward_components") or {},
        "_offset": offset,
    }


def sample_rows(rows: list[dict[str, Any]], max_n: int) -> tuple[list[dict[str, Any]], str]:
    """Keep at most ``max_n`` rows: all failed ones (up to half the budget), the rest evenly spaced
    within each step. Returns the kept rows (file order) and a sentence saying what was done."""
    if len(rows) <= max_n:
        return rows, f"all {len(rows)} episodes"
    failed = [i for i, r in enumerate(rows) if r["failure"]][: max_n // 2]
    taken = set(failed)
    by_step: dict[Any, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if i not in taken:
            by_step[r["step"]].append(i)
    budget, steps = max_n - len(taken), sorted(by_step, key=lambda s: (s is None, s or 0))
    for k, s in enumerate(steps):
        quota = budget // len(steps) + (1 if k < budget % len(steps) else 0)
        idx = by_step[s]
        n = min(quota, len(idx))
        taken.update(idx[int(j * len(idx) / n)] for j in range(n))
    keep = sorted(taken)
    nfail = sum(1 for r in rows if r["failure"])
    note = (
        f"{len(keep)} of {len(rows)} episodes: {len(failed)} of {nfail} failed episodes kept, "
        f"the rest sampled evenly within each of {len(steps)} steps (max_episodes={max_n})"
    )
    return [rows[i] for i in keep], note


def step_curves(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-step means computed from every episode (used when metrics.jsonl is missing)."""
    acc: dict[Any, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["step"] is None:
            continue
        a = acc[r["step"]]
        a[CURVES["reward"]].append(r["reward"] or 0.0)
        a[CURVES["length"]].append(r["policy_tokens"])
        a[CURVES["failed"]].append(1.0 if r["failure"] else 0.0)
        if r["entropy"] is not None:
            a[CURVES["entropy"]].append(r["entropy"])
    return [{"step": s, **{k: _r(sum(v) / len(v)) for k, v in acc[s].items()}} for s in sorted(acc)]


# -- per-episode token payload ------------------------------------------------------------------
def _r(x: Any, nd: int = 4) -> Any:
    if x is None or isinstance(x, (bool, int)):
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return round(float(x), nd)


class PieceDecoder:
    """Per-token text with a per-id cache; a token that is only part of a UTF-8 character is decoded
    together with its neighbours (the text goes on the first one). Without a tokenizer the segment
    text is split evenly across its tokens (the page says the boundaries are approximate)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def _dec(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def pieces(self, ids: Sequence[int], text: str) -> list[str]:
        if self.tok is None:
            n = len(ids)
            return [text[len(text) * i // n : len(text) * (i + 1) // n] for i in range(n)] if n else []
        out: list[str] = []
        i = 0
        while i < len(ids):
            p = self.cache.get(ids[i])
            if p is None:
                p = self.cache[ids[i]] = self._dec([ids[i]])
            if "\ufffd" not in p:
                out.append(p)
                i += 1
                continue
            j = i + 1
            while j < len(ids) and j - i < 4 and "\ufffd" in self._dec(ids[i:j]):
                j += 1
            out.extend([self._dec(ids[i:j])] + [""] * (j - i - 1))
            i = j
        return out


def episode_payload(ep: Episode, decoder: PieceDecoder) -> dict[str, Any]:
    """Columnar token data for the page: text pieces, segments, engine logprobs and overlays."""
    pieces: list[str] = []
    segs = []
    for s in ep.segments:
        segs.append([s.role, s.turn, len(pieces), len(pieces) + len(s.token_ids)])
        pieces.extend(decoder.pieces(s.token_ids, s.text))
    n = len(pieces)
    overlays = {}
    given = ep.overlays or {}
    for k in [*OVERLAY_KEYS, *sorted(set(given) - set(OVERLAY_KEYS))]:  # known keys first, extras kept
        v = given.get(k)
        if isinstance(v, list) and len(v) == n:
            overlays[k] = [_r(x) if isinstance(x, (int, float)) else None for x in v]
    return {
        "id": ep.id,
        "pieces": pieces,
        "segments": segs,
        "engine_logp": [_r(x) for x in ep.engine_logprobs()],
        "overlays": overlays,
        "messages_n": len(ep.messages),
        "breaks": [  # where each training sample after the first starts, and why (a compaction...)
            [start, sample_break_title(b)] for (start, _), b in zip(ep.sample_ranges()[1:], ep.sample_breaks)
        ],
        "failure": {"boundary": ep.failure.boundary, "message": ep.failure.message} if ep.failure else None,
        "metrics": {k: v for k, v in ep.metrics.items() if k not in ("tools", "task")},
        "task": ep.metrics.get("task"),
    }


def selection_cutoffs(
    payloads: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """Per step, the lowest surprisal among selected tokens (+1 / -1) in the embedded episodes: the
    effective top-P cutoff a selected token had to clear (exact only when every episode is shown)."""
    out: dict[str, dict[str, float]] = {}
    for p, r in zip(payloads, rows):
        sel, lp = p["overlays"].get("selected"), p["overlays"].get("logp_old") or p["engine_logp"]
        if not sel:
            continue
        cut = out.setdefault(str(r["step"]), {})
        for x, lpi in zip(sel, lp):
            if x and lpi is not None:
                key = "plus" if x > 0 else "minus"
                cut[key] = min(cut.get(key, math.inf), -lpi)
    return {s: {k: _r(v) for k, v in c.items()} for s, c in out.items()}


# -- the page -----------------------------------------------------------------------------------
def _asset(name: str) -> str:
    return resources.files("agentrl.views.viewer").joinpath(name).read_text(encoding="utf-8")


def render_html(data: dict[str, Any]) -> str:
    """Inline CSS, JS and the data into the template: one file, nothing fetched."""
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    blob = blob.replace("</", "<\\/").replace("<!--", "\\u003c!--")  # cannot close the <script> early
    html = _asset("template.html")
    for key, value in (("/*__CSS__*/", _asset("viewer.css")), ("/*__JS__*/", _asset("viewer.js"))):
        html = html.replace(key, value)
    return html.replace("__TITLE__", _html_escape(str(data["run"]["name"]))).replace("__DATA__", blob)


def _html_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def build_data(run_dir: str, max_episodes: int = 2000) -> dict[str, Any]:
    """Everything the page shows, as JSON-able data."""
    import warnings

    tpath = transcripts_path(run_dir)
    run = run_dir_of(run_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TranscriptWarning)
        rows = [summarize(d, off) for off, d in iter_records(tpath)] if tpath.exists() else []
        metrics = read_metrics(run) if run is not None else []
    kept, note = sample_rows(rows, max_episodes)
    tokenizer, where, _ = first_tokenizer(tokenizer_candidates(run_dir))
    decoder = PieceDecoder(tokenizer)
    payloads = [episode_payload(read_episode_at(tpath, r["_offset"]), decoder) for r in kept]
    for r in kept:
        r.pop("_offset")
    numeric = [m for m in metrics if isinstance(m, dict)]
    return {
        "format": 1,
        "run": {
            "name": Path(run or tpath.parent).resolve().name,
            "path": str(run or tpath),
            "config": load_run_config(run),
        },
        "metrics": numeric or step_curves(rows),
        "metrics_source": "metrics.jsonl" if numeric else "computed from transcripts",
        "important": IMPORTANT,
        "curves": CURVES,
        "episodes": kept,
        "tokens": payloads,
        "sampling": {"total": len(rows), "kept": len(kept), "note": note},
        "tokenizer": where,
        "cutoffs": selection_cutoffs(payloads, kept),
        "warnings": [str(w.message) for w in caught],
        "history": list(run_history.describe(run_history.read(run))) if run is not None else [],
    }


def inspect_command(run_dir: str, output: str | None = None, max_episodes: int = 2000) -> int:
    """Write the HTML page (default RUN_DIR/inspect.html); 0 on success, 2 when there is nothing."""
    from rich.console import Console

    console = Console()
    tpath = transcripts_path(run_dir)
    if not tpath.exists() and not (Path(run_dir) / "metrics.jsonl").exists():
        console.print(f"[red]inspect: no transcripts or metrics under {run_dir}[/red]")
        return 2
    data = build_data(run_dir, max_episodes=max_episodes)
    out = (
        Path(output)
        if output
        else (Path(run_dir) if Path(run_dir).is_dir() else tpath.parent) / "inspect.html"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(render_html(data), encoding="utf-8")
    os.replace(tmp, out)
    for w in data["warnings"]:
        console.print(f"[yellow]warning: {w}[/yellow]")
    if data["tokenizer"] is None:
        console.print("[yellow]no tokenizer found: token boundaries on the page are approximate[/yellow]")
    console.print(f"inspect: {data['sampling']['note']} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0
