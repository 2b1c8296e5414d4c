"""``agentrl doctor``: compare each episode's token ids with a full re-render of its messages.

The runner never re-tokenizes: it keeps the ids the engine sampled and renders observations as
deltas. A framework that instead re-renders the conversation with the chat template before training
would train on different tokens than the policy produced. The doctor shows, per episode, exactly where
the two disagree and why, so a user can tell harmless template quirks from drift that changes what
the policy is trained on. Each differing region is classified (first match wins):

- ``retokenized``: same text, different token split (the classic decode-then-encode drift);
- ``reasoning``: a <think>...</think> block present on one side only (templates strip reasoning
  from earlier assistant turns);
- ``eot_whitespace``: whitespace next to an end-of-turn token (e.g. the "\\n" the template writes
  after <|im_end|>, which a policy that stopped on <|im_end|> never produced);
- ``whitespace``: other whitespace-only differences;
- ``tool_grouping``: only chat structure differs around tool calls/outputs (the template merges
  consecutive tool messages into one turn, or splits them);
- ``other``.

A region touches a policy token when it replaces or deletes a token whose stored role is ``policy``,
or inserts inside a policy segment. Exit code 1 when any region does, 2 when the doctor cannot run.

An episode split into several training samples (``Episode.sample_breaks``: a thinking template's
history, or an agent's drifting client) is checked per sample: each sample's ids against the render
of the messages it covers, up to its last assistant turn (the observation after it opens the next
sample). The report starts with the template's history probe (``agentrl.chat_templates``): whether
it strips earlier reasoning, the policy that follows, and the policy the run recorded if it differs.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.episode import Episode
from agentrl.transcripts import (
    TranscriptWarning,
    first_tokenizer,
    iter_episodes,
    tokenizer_candidates,
    transcripts_path,
)

DRIFT_KINDS = ("retokenized", "reasoning", "eot_whitespace", "whitespace", "tool_grouping", "other")
_EOT_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<|endoftext|>", "<end_of_turn>")
_TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "tool")
_ROLE_WORDS = re.compile(r"\b(system|user|assistant|tool|ipython)\b")
_MERGE_GAP = 2
"""Differing regions separated by at most this many equal tokens are one region: the matcher
sometimes anchors a deleted block on a stray shared token (a newline) in its middle."""


@dataclass
class Drift:
    kind: str
    stored: tuple[int, int]
    """Token range [start, end) in the stored ids."""
    rendered: tuple[int, int]
    stored_text: str
    rendered_text: str
    roles: list[str]
    """Distinct stored roles inside the region (for an insertion: the roles on either side)."""
    touches_policy: bool
    sample: int = 0
    """Which training sample of the episode (0 unless it was split); the token ranges are that
    sample's."""


@dataclass
class Diagnosis:
    episode_id: str
    drifts: list[Drift] = field(default_factory=list)
    error: str | None = None
    samples: int = 1

    @property
    def policy_drift(self) -> bool:
        return any(d.touches_policy for d in self.drifts)


def render_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: Sequence[dict] | None) -> list[int]:
    """Token ids of a full chat-template render (generation prompt when the last turn is not ours)."""
    gen = bool(messages) and messages[-1].get("role") != "assistant"
    out = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=True, add_generation_prompt=gen
    )
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(t) for t in out]


def _regions(stored: list[int], rendered: list[int]) -> list[tuple[int, int, int, int]]:
    sm = difflib.SequenceMatcher(None, stored, rendered, autojunk=False)
    out: list[list[int]] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        if out and i1 - out[-1][1] <= _MERGE_GAP and j1 - out[-1][3] <= _MERGE_GAP:
            out[-1][1], out[-1][3] = i2, j2
        else:
            out.append([i1, i2, j1, j2])
    return [(a, b, c, d) for a, b, c, d in out]


def _squash(s: str) -> str:
    return "".join(s.split())


def _structure_residue(text: str, specials: Sequence[str]) -> str:
    for sp in sorted(set(specials) | set(_TOOL_MARKERS[:4]), key=len, reverse=True):
        text = text.replace(sp, "")
    return _squash(_ROLE_WORDS.sub("", text))


def classify(stored_text: str, rendered_text: str, before: str, after: str, specials: Sequence[str]) -> str:
    """The drift class of one region; ``before``/``after`` are a few tokens of context as text."""
    s, r = stored_text, rendered_text
    if s == r:
        return "retokenized"
    if any((m in s) != (m in r) for m in ("<think>", "</think>")):
        return "reasoning"
    if _squash(s) == _squash(r):
        near_eot = any(before.endswith(t) or after.startswith(t) or t in s + r for t in _EOT_TOKENS)
        return "eot_whitespace" if near_eot else "whitespace"
    context = before + s + r + after
    if any(m in context for m in _TOOL_MARKERS) and _structure_residue(s, specials) == _structure_residue(
        r, specials
    ):
        return "tool_grouping"
    return "other"


def _control_tokens(tokenizer: Any) -> list[str]:
    """Special and added tokens (role markers, end-of-turn, tool tags) as text."""
    out = set(getattr(tokenizer, "all_special_tokens", []) or [])
    get_added = getattr(tokenizer, "get_added_vocab", None)
    if callable(get_added):
        out |= set(get_added())
    return sorted(out)


def diagnose(episode: Episode, tokenizer: Any, context: int = 6) -> Diagnosis:
    """Compare one episode's stored ids with the template's render of its messages, per sample."""
    diag = Diagnosis(episode.id, samples=episode.num_samples)
    if not episode.messages:
        diag.error = "no messages stored"
        return diag
    views = episode.sample_views()
    for k, view in enumerate(views):
        messages = view.messages
        if k < len(views) - 1:  # the observation that opened the next sample is not in this one
            while messages and messages[-1].get("role") != "assistant":
                messages = messages[:-1]
        try:
            diag.drifts += _drifts(view, messages, tokenizer, context, sample=k)
        except Exception as e:  # a template that rejects the conversation is a finding, not a crash
            where = f" (sample {k})" if len(views) > 1 else ""
            diag.error = f"chat template failed{where}: {type(e).__name__}: {e}"
            return diag
    return diag


def _drifts(
    view: Episode, messages: list[dict[str, Any]], tokenizer: Any, context: int, sample: int
) -> list[Drift]:
    # tools placed in the system message (metrics.tools_prompt) are in the messages already
    tools = None if view.metrics.get("tools_prompt") == "system" else view.metrics.get("tools")
    rendered = render_ids(tokenizer, messages, tools)
    stored, roles = view.token_ids(), view.roles()
    specials = _control_tokens(tokenizer)

    def dec(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False) if ids else ""

    drifts = []
    for i1, i2, j1, j2 in _regions(stored, rendered):
        s_text, r_text = dec(stored[i1:i2]), dec(rendered[j1:j2])
        kind = classify(
            s_text, r_text, dec(stored[max(0, i1 - context) : i1]), dec(stored[i2 : i2 + context]), specials
        )
        if i1 < i2:
            region_roles = roles[i1:i2]
            touches = "policy" in region_roles
        else:  # an insertion: it changes policy tokens only when it lands inside a policy segment
            region_roles = roles[max(0, i1 - 1) : i1 + 1]
            touches = 0 < i1 < len(roles) and roles[i1 - 1] == roles[i1] == "policy"
        drifts.append(
            Drift(kind, (i1, i2), (j1, j2), s_text, r_text, sorted(set(region_roles)), touches, sample)
        )
    return drifts


# -- the command ----------------------------------------------------------------------------------
def doctor_command(path: str, model: str | None = None, verbose: bool = False) -> int:
    """Diagnose every episode in PATH (a transcript file or a run directory); print a summary.
    Returns 1 if any policy token would differ, 2 if the doctor cannot run, else 0."""
    from rich.console import Console

    console = Console()
    tpath = transcripts_path(path)
    if not tpath.exists():
        console.print(f"[red]doctor: no transcript at {tpath}[/red]")
        return 2
    tokenizer, where, errors = first_tokenizer(tokenizer_candidates(path, model))
    if tokenizer is None:
        console.print(
            "[red]doctor: no tokenizer found[/red] (pass --model DIR, or run it inside a run directory)"
        )
        for e in errors:
            console.print(f"  tried {e}")
        return 2
    console.print(f"doctor: {tpath} with tokenizer {where}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TranscriptWarning)
        episodes = list(iter_episodes(tpath))
        diags = [diagnose(ep, tokenizer) for ep in episodes]
    for w in caught:
        console.print(f"[yellow]warning: {w.message}[/yellow]")
    print_history(console, tokenizer, episodes)
    print_report(console, diags, verbose)
    return 1 if any(d.policy_drift for d in diags) else 0


def print_history(console: Any, tokenizer: Any, episodes: Sequence[Episode]) -> None:
    """The template's history probe, the policy the run recorded where it differs, and how many
    episodes were split into several training samples, by reason."""
    from rich.markup import escape

    from agentrl.chat_templates import probe_history

    try:
        probe = probe_history(tokenizer)
        console.print(f"history: {probe.policy} — {escape(probe.reason)}")
        probed = (probe.policy, probe.reason)
    except Exception as e:  # a template the probe cannot render is reported, the rest still runs
        console.print(
            f"[yellow]history: unknown — the probe failed: {escape(f'{type(e).__name__}: {e}')}[/yellow]"
        )
        probed = None
    used: Counter[tuple[str, str]] = Counter()
    for ep in episodes:
        recorded = ep.metrics.get("history")
        if isinstance(recorded, dict) and "policy" in recorded:
            used[(str(recorded["policy"]), str(recorded.get("reason", "")))] += 1
    for (policy, reason), n in sorted(used.items()):
        if (policy, reason) != probed:
            console.print(f"history used by the run ({n} episode(s)): {policy} — {escape(reason)}")
    split = [ep for ep in episodes if ep.num_samples > 1]
    if split:
        reasons = Counter(str(b.get("reason", "?")) for ep in split for b in ep.sample_breaks)
        by_reason = ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items()))
        samples = sum(ep.num_samples for ep in split)
        console.print(f"{len(split)} episode(s) split into {samples} samples ({escape(by_reason)})")


def print_report(console: Any, diags: list[Diagnosis], verbose: bool) -> None:
    from rich.markup import escape

    skipped = sum(d.error is not None for d in diags)
    regions: Counter[str] = Counter()
    policy_regions: Counter[str] = Counter()
    episodes: Counter[str] = Counter()
    for d in diags:
        for kind in {x.kind for x in d.drifts}:
            episodes[kind] += 1
        for x in d.drifts:
            regions[x.kind] += 1
            policy_regions[x.kind] += int(x.touches_policy)
    for d in diags:
        if not d.drifts and not d.error and not verbose:
            continue
        mark = "[red]POLICY[/red]" if d.policy_drift else ("[yellow]skipped[/yellow]" if d.error else "ok")
        kinds = ", ".join(sorted({x.kind for x in d.drifts})) or d.error or "identical"
        samples = f" ({d.samples} samples)" if d.samples > 1 else ""
        console.print(f"{mark} {escape(d.episode_id)}{samples}: {escape(kinds)}")
        if verbose:
            for x in d.drifts:
                flag = " [red](policy)[/red]" if x.touches_policy else ""
                where = f"sample {x.sample} " if d.samples > 1 else ""
                console.print(
                    f"    {x.kind}{flag} {where}stored[{x.stored[0]}:{x.stored[1]}] {escape(str(x.roles))}: "
                    f"{escape(repr(x.stored_text))} -> rendered {escape(repr(x.rendered_text))}"
                )
    if not any(d.drifts for d in diags):
        console.print(f"[green]{len(diags) - skipped} episode(s) identical to a full re-render.[/green]")
    if any(regions.values()) or skipped:
        console.print(_summary_table(diags, regions, policy_regions, episodes, skipped))
    bad = sum(d.policy_drift for d in diags)
    if bad:
        console.print(
            f"[red]{bad} episode(s) would train on different policy tokens after a re-render.[/red]"
        )
    else:
        console.print("[green]no policy token would differ.[/green]")


def _summary_table(diags: list[Diagnosis], regions: Counter[str], policy_regions: Counter[str],
                   episodes: Counter[str], skipped: int) -> Any:  # fmt: skip
    from rich.table import Table

    table = Table(
        title=f"doctor: {len(diags)} episodes, {sum(bool(d.drifts) for d in diags)} with differences"
    )
    for col in ("difference", "episodes", "regions", "touching policy tokens"):
        table.add_column(col, justify="left" if col == "difference" else "right")
    for kind in DRIFT_KINDS:
        if regions[kind]:
            style = "red" if policy_regions[kind] else ""
            table.add_row(
                kind, str(episodes[kind]), str(regions[kind]), str(policy_regions[kind]), style=style
            )
    if skipped:
        table.add_row("skipped (no messages / template error)", str(skipped), "-", "-", style="yellow")
    return table
