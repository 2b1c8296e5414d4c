"""``agentrl replay``: read episodes in the terminal, and check them against today's code.

Rendering follows the stored segments (the tokens the model actually saw and wrote), not the chat
messages: policy turns in green with their tool calls framed, tool output and environment messages
in their own frames, template scaffolding as one dim line, then the reward, the stop reason and, for a
failed episode, the boundary where it failed.

``--rerun`` re-creates the environment, resets it on the recorded task and seed, feeds it the recorded
assistant turns one by one and reports every observation that differs from the recording (a tool
that is not deterministic, an environment whose code changed, or tool output the runner truncated).
``--rescore`` recomputes the environment's reward functions on the recorded conversation and reports
components that differ. Both need ``episode.metrics["task"]`` (the runner stores it).
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any

from agentrl.config import run_history
from agentrl.episode import Episode
from agentrl.transcripts import (
    TranscriptWarning,
    iter_episodes,
    load_run_config,
    run_dir_of,
    transcripts_path,
)

_ROLE_STYLE = {
    "policy": "green",
    "tool": "blue",
    "env": "yellow",
    "prompt": "cyan",
    "scaffold": "bright_black",
}
_CALL = re.compile(r"(<tool_call>.*?(?:</tool_call>|$)|```(?:python|py)[ \t]*\n.*?(?:```|$))", re.S)
_TOL = 1e-9


# -- rendering ----------------------------------------------------------------------------------
def _shorten(text: str, limit: int) -> str:
    return (
        text
        if len(text) <= limit
        else text[: limit // 2] + f"\n… ({len(text) - limit} chars) …\n" + text[-limit // 2 :]
    )


def _policy_body(text: str) -> Any:
    """Policy text with each tool call (JSON or code block) in its own frame."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    parts: list[Any] = []
    for i, chunk in enumerate(_CALL.split(text)):
        if not chunk:
            continue
        if i % 2:
            parts.append(
                Panel(
                    Text(chunk, style="bold magenta"), title="tool call", border_style="magenta", expand=False
                )
            )
        else:
            parts.append(Text(chunk))
    return Group(*parts) if parts else Text("")


def _header(ep: Episode) -> Any:
    from rich.table import Table

    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    comps = ", ".join(f"{k}={v:.4g}" for k, v in ep.reward_components.items())
    rows = [
        ("env / task", f"{ep.env} / {ep.task_id} (seed {ep.seed})"),
        ("step / group", f"{ep.step} / {ep.group}"),
        ("reward", f"{ep.reward:.4g}" + (f"  ({comps})" if comps else "")),
        ("stop reason", str(ep.stop_reason)),
        ("turns ended by", ", ".join(ep.metrics.get("stop_reasons") or ["(not recorded)"])),
        ("tokens", f"{len(ep.token_ids())} total, {ep.num_policy_tokens} policy, {ep.num_turns} turns"),
    ]
    if ep.overlays:
        rows.append(("overlays", ", ".join(k for k, v in ep.overlays.items() if v)))
    if ep.metrics.get("weighting"):
        rows.append(("weighting", str(ep.metrics["weighting"])))
    for k, v in rows:
        t.add_row(k, v)
    return t


def render_episode(ep: Episode, console: Any, max_chars: int = 4000) -> None:
    """Print one episode: header, the prompt, each turn, then the outcome."""
    from rich.panel import Panel
    from rich.rule import Rule
    from rich.text import Text

    console.print(Rule(f"episode {ep.id}", style="bold"))
    console.print(_header(ep))
    scaffold = ""  # consecutive scaffold segments print as one dim line
    breaks = {b["segment"]: b for b in ep.sample_breaks}
    for i, seg in enumerate(ep.segments):
        style = _ROLE_STYLE[seg.role]
        if i in breaks:
            if scaffold:
                console.print(Text(f"  ⟨scaffold {scaffold!r}⟩", style=_ROLE_STYLE["scaffold"]))
                scaffold = ""
            console.print(Rule(sample_break_title(breaks[i]), style="magenta"))
        if seg.role == "scaffold":
            scaffold += seg.text
            continue
        if scaffold:
            console.print(Text(f"  ⟨scaffold {scaffold!r}⟩", style=_ROLE_STYLE["scaffold"]))
            scaffold = ""
        title = f"{seg.role} · turn {seg.turn} · {len(seg.token_ids)} tokens"
        if seg.role == "policy" and seg.logprobs:
            title += f" · mean logp {sum(seg.logprobs) / len(seg.logprobs):.3f}"
            if seg.weight_version is not None:
                title += f" · weights v{seg.weight_version}"
        body = (
            _policy_body(_shorten(seg.text, max_chars))
            if seg.role == "policy"
            else Text(_shorten(seg.text, max_chars))
        )
        label = {"tool": "tool output", "env": "environment", "prompt": "prompt"}.get(seg.role, seg.role)
        console.print(
            Panel(body, title=title.replace(seg.role, label, 1), title_align="left", border_style=style)
        )
    if scaffold:
        console.print(Text(f"  ⟨scaffold {scaffold!r}⟩", style=_ROLE_STYLE["scaffold"]))
    outcome = f"reward {ep.reward:.4g} · stop reason {ep.stop_reason}"
    if ep.failure is not None:
        console.print(
            Panel(
                Text(ep.failure.message),
                title=f"FAILED at the {ep.failure.boundary} boundary",
                border_style="red bold",
            )
        )
    console.print(Text(outcome, style="bold red" if ep.failed else "bold"))


def sample_break_title(brk: dict[str, Any]) -> str:
    """The line that marks where a new training sample starts, and why (``Episode.sample_breaks``):
    a compaction says what its summary kept, a window how many turns it dropped."""
    reason = str(brk.get("reason", "?"))
    if reason == "compaction":
        kept = " ".join(str(brk.get("summary", "")).split())
        return f"new sample: compaction, the next prompt keeps the task, the summary ({_shorten(kept, 120)!r}) and the latest observation"
    if reason == "window":
        return (
            f"new sample: window, the {brk.get('dropped_turns', '?')} oldest turn(s) dropped from the context"
        )
    return f"new sample: {reason}"


# -- rerun / rescore ----------------------------------------------------------------------------
def task_of(ep: Episode) -> Any:
    """The Task record the runner stored in ``metrics["task"]``."""
    from agentrl.env import Task

    d = ep.metrics.get("task")
    if not isinstance(d, dict) or "id" not in d:
        raise ValueError("the episode does not store its task (metrics['task']); it cannot be re-run")
    return Task(d["id"], d.get("prompt", ""), d.get("answer"), d.get("metadata") or {})


def env_options(ep: Episode, path: str | None) -> dict[str, Any]:
    """Environment options: stored on the episode, else the run config's when it names this env."""
    if isinstance(ep.metrics.get("env_options"), dict):
        return dict(ep.metrics["env_options"])
    env_cfg = load_run_config(run_dir_of(path) if path else None).get("env") or {}
    if env_cfg.get("name") == ep.env and isinstance(env_cfg.get("options"), dict):
        return dict(env_cfg["options"])
    return {}


def prepare_environments(path: str, module: str | None) -> dict[str, Any]:
    """Make the run's environments constructible here, as the run made them: import ``module``
    (``--module``) or the run config's ``env.module``, and return the keyword arguments every
    environment gets besides its options (the run's sandbox). Raises ``ValueError`` saying what to do."""
    from agentrl.assembly.components import sandbox_spec
    from agentrl.config import ConfigError, load_config
    from agentrl.env import import_environment_module

    if module:
        try:
            import_environment_module(module)
        except Exception as e:
            raise ValueError(f"--module {module!r} cannot be imported: {type(e).__name__}: {e}") from e
    run = run_dir_of(path)
    if run is None:
        return {}
    overrides = [f"env.module={module}"] if module else []
    try:
        cfg = load_config(run, overrides)  # imports the run's env.module, checked like a training run
    except ConfigError as e:
        raise ValueError(
            f"the run's config at {run} does not load here: {e} (pass --module to point at the environment's file)"
        ) from e
    return {"sandbox": sandbox_spec(cfg)}


def _message_diff(where: str, want: list[dict], got: list[dict]) -> list[str]:
    out = []
    if len(want) != len(got):
        out.append(f"{where}: recorded {len(want)} message(s), re-run gave {len(got)}")
    for k, (w, g) in enumerate(zip(want, got)):
        for key in ("role", "name"):
            if w.get(key) != g.get(key) and (key == "role" or w.get(key) is not None):
                out.append(f"{where} message {k}: {key} {w.get(key)!r} -> {g.get(key)!r}")
        wc, gc = str(w.get("content", "")), str(g.get("content", ""))
        if wc != gc:
            diff = difflib.unified_diff(
                wc.splitlines(), gc.splitlines(), "recorded", "re-run", lineterm="", n=1
            )
            out.append(f"{where} message {k} content differs:\n" + "\n".join(list(diff)[:20]))
    return out


def rerun_episode(ep: Episode, options: dict[str, Any] | None = None) -> list[str]:
    """Replay the recorded assistant turns through a fresh environment (``options``: its keyword
    arguments); return the differences."""
    from agentrl.env import make_env

    task, msgs = task_of(ep), ep.messages
    env = make_env(ep.env, **(options or {}))
    diffs: list[str] = []
    try:
        first = env.reset(task, ep.seed)
        starts = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
        diffs += _message_diff("reset", msgs[: starts[0]] if starts else msgs, list(first))
        for turn, i in enumerate(starts):
            nxt = starts[turn + 1] if turn + 1 < len(starts) else len(msgs)
            try:
                result = env.step(str(msgs[i].get("content", "")))
            except Exception as e:
                rec = (
                    f" (recorded failure: {ep.failure.boundary}: {ep.failure.message})" if ep.failure else ""
                )
                diffs.append(f"turn {turn}: step raised {type(e).__name__}: {e}{rec}")
                if ep.failure is not None and nxt == len(msgs):
                    diffs.pop()  # the recorded episode failed here too: reproduced, not a difference
                break
            diffs += _message_diff(f"turn {turn}", msgs[i + 1 : nxt], list(result.observation))
            if (result.terminated or result.truncated) and nxt < len(msgs):
                diffs.append(f"turn {turn}: the environment ended the episode but the recording continues")
                break
    finally:
        env.close()
    return diffs


def final_text_of(ep: Episode) -> str | None:
    """The final answer reward functions see: the last assistant turn when the episode was answered."""
    if ep.stop_reason != "answered":
        return None
    last = [m for m in ep.messages if m.get("role") == "assistant"]
    return str(last[-1].get("content", "")) if last else None


def rescore_episode(ep: Episode, options: dict[str, Any] | None = None) -> list[str]:
    """Recompute the environment's rewards on the recorded conversation; return the differences."""
    from agentrl.env import EpisodeState, make_env

    task = task_of(ep)
    env = make_env(ep.env, **(options or {}))
    diffs: list[str] = []
    try:
        env.reset(task, ep.seed)
        state = EpisodeState(task, list(ep.messages), final_text_of(ep), info={})
        total = 0.0
        for r in env.rewards():
            try:
                v = float(r.fn(task, state))
            except Exception as e:
                diffs.append(f"reward {r.name!r} raised {type(e).__name__}: {e}")
                continue
            total += r.weight * v
            old = ep.reward_components.get(r.name)
            if old is None:
                diffs.append(f"reward {r.name!r}: new component = {v:.6g} (not recorded)")
            elif not math.isclose(old, v, rel_tol=_TOL, abs_tol=_TOL):
                diffs.append(f"reward {r.name!r}: recorded {old:.6g} -> now {v:.6g}")
        names = {r.name for r in env.rewards()}
        diffs += [
            f"reward {k!r}: recorded but no longer computed" for k in ep.reward_components if k not in names
        ]
        if (
            not diffs
            and ep.failure is None
            and not math.isclose(total, ep.reward, rel_tol=_TOL, abs_tol=_TOL)
        ):
            diffs.append(f"total reward: recorded {ep.reward:.6g} -> weighted sum now {total:.6g}")
    finally:
        env.close()
    return diffs


def _check(console: Any, what: str, fn: Any, ep: Episode, options: dict[str, Any]) -> bool:
    """Run rerun/rescore on one episode and print the verdict; True when something differs."""
    from rich.markup import escape

    try:
        diffs = fn(ep, options)
    except Exception as e:  # an environment that no longer builds is a finding, not a crash
        diffs = [f"could not {what}: {type(e).__name__}: {e}"]
    if not diffs:
        console.print(f"[green]{what}: identical[/green]")
        return False
    console.print(f"[red]{what}: {len(diffs)} difference(s)[/red]")
    for d in diffs:
        console.print("  " + escape(d))
    return True


def replay_command(
    path: str,
    episode: str | None = None,
    step: int | None = None,
    filter: str | None = None,
    rerun: bool = False,
    rescore: bool = False,
    limit: int = 20,
    console: Any = None,
    module: str | None = None,
) -> int:
    """Render matching episodes; with --rerun/--rescore also check them. Exit code: 0 ok, 1 when a
    check found differences, 2 when nothing matched or the input is unusable."""
    import warnings

    from rich.console import Console

    console = console or Console()
    tpath = transcripts_path(path)
    if not Path(tpath).exists():
        console.print(f"[red]replay: no transcript at {tpath}[/red]")
        return 2
    _print_history(console, path)
    context: dict[str, Any] = {}
    if rerun or rescore:
        try:
            context = prepare_environments(path, module)
        except ValueError as e:
            console.print(f"[red]replay: {e}[/red]")
            return 2
    shown, differs = 0, False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TranscriptWarning)
        try:
            for ep in iter_episodes(tpath, step=step, episode=episode, filter=filter):
                if shown >= limit:
                    console.print(
                        f"[yellow]… more episodes match; showing the first {limit} (--limit)[/yellow]"
                    )
                    break
                render_episode(ep, console)
                if rerun or rescore:
                    differs |= _check_episode(
                        console, ep, {**context, **env_options(ep, path)}, rerun, rescore
                    )
                shown += 1
        except ValueError as e:
            console.print(f"[red]replay: {e}[/red]")
            return 2
    for w in caught:
        console.print(f"[yellow]warning: {w.message}[/yellow]")
    if shown == 0:
        console.print("[yellow]replay: no episode matched[/yellow]")
        return 2
    return 1 if differs else 0


def _print_history(console: Any, path: str) -> None:
    """A resumed run's history (history.jsonl): when it resumed, and which keys changed."""
    run = run_dir_of(path)
    history = list(run_history.describe(run_history.read(run))) if run is not None else []
    if len(history) > 1:
        console.print(
            "run history (history.jsonl):\n" + "\n".join(f"  {h}" for h in history),
            highlight=False,
            soft_wrap=True,
        )


def _check_episode(console: Any, ep: Any, opts: dict[str, Any], rerun: bool, rescore: bool) -> bool:
    """Rerun and/or rescore one episode; True when a check found a difference."""
    differs = False
    if rerun:
        differs |= _check(console, "rerun", rerun_episode, ep, opts)
    if rescore:
        differs |= _check(console, "rescore", rescore_episode, ep, opts)
    return differs
