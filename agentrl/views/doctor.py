"""``agentrl doctor``: compare each episode's token ids with a full re-render of its messages, and
report every differing region with its class (``agentrl.rollout.drift`` says how regions are found and
classified). Exit code 1 when any region touches a policy token or the masking check fails
(``agentrl.views.masking``: feedback tokens in the loss, a tool result the model never saw), 2 when
the doctor cannot run.

The report starts with the template's history probe (``agentrl.models.chat_templates``): whether it strips
earlier reasoning, the policy that follows, and the policy the run recorded if it differs.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentrl.episode import Episode
from agentrl.rollout.drift import DRIFT_KINDS, Diagnosis, diagnose
from agentrl.transcripts import (
    TranscriptWarning,
    iter_episodes,
    transcripts_path,
)
from agentrl.views.masking import masking_lines, masking_report
from agentrl.views.run_tokenizer import first_tokenizer, tokenizer_candidates


# -- the command ----------------------------------------------------------------------------------
def doctor_command(path: str, model: str | None = None, verbose: bool = False) -> int:
    """Diagnose every episode in PATH (a transcript file or a run directory); print a summary.
    Returns 1 if any policy token would differ or feedback entered the loss, 2 if the doctor cannot
    run, else 0."""
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
    masking = masking_report(episodes)
    for line in masking_lines(masking):
        console.print(line)
    return 1 if any(d.policy_drift for d in diags) or not masking.ok else 0


def print_history(console: Any, tokenizer: Any, episodes: Sequence[Episode]) -> None:
    """The template's history probe, the policy the run recorded where it differs, and how many
    episodes were split into several training samples, by reason."""
    from rich.markup import escape

    from agentrl.models.chat_templates import probe_history

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


def _summary_table(
    diags: list[Diagnosis],
    regions: Counter[str],
    policy_regions: Counter[str],
    episodes: Counter[str],
    skipped: int,
) -> Any:
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
