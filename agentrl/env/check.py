"""``agentrl envs check NAME``: run an environment against a scripted policy and report contract
violations (in the spirit of Gymnasium's ``check_env``).

Checks: tasks load with disjoint splits; ``reset`` returns JSON-serialisable chat messages ending
with a user message; tool schemas are well-formed; malformed, unknown and badly-typed tool calls and
a void turn come back as observations or clean terminations, never exceptions; the solver's
demonstrations of up to ``DEMO_TASKS`` training tasks replay through ``step`` with the same tool
outputs and earn a positive reward; ``close`` can be called twice.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.env import (
    Environment,
    EpisodeState,
    Reward,
    StepResult,
    Task,
    checked_messages,
    checked_step,
    make_env,
    task_loading_options,
)
from agentrl.env.values import reward_value
from agentrl.errors import OptionsRequired
from agentrl.timeouts import BoundedCalls, WaitTimeout

ENV_LIMIT_S = 600.0
"""The default limit of each call, ``timeouts.env_step_s``'s default (what rollouts allow)."""

DEMO_TASKS = 32
"""Training tasks whose demonstrations are replayed (all of them when there are fewer): a reward that
raises on one task in four passes 32 replays by chance with probability 0.75**32, about 1e-4 (with
the 3 replays the check once made, 0.42)."""

SHOWN_FAILURES = 3
"""FAIL lines shown for failing demonstrations; the count line says how many more failed."""

LINE_CHARS = 1000
"""What a report line shows at most: a tool output of 5 MB in a FAIL line is cut to its first
characters and its length."""

SCRIPTED_BAD_ACTIONS = {
    "malformed JSON tool call": '<tool_call>{"name": "x", "arguments": {</tool_call>',
    "unclosed tool call": '<tool_call>{"name": "x"',
    "unknown tool": '<tool_call>{"name": "no_such_tool_xyz", "arguments": {}}</tool_call>',
    "unclosed code block": "```python\nprint(1)\n",
    "void turn (no call, no answer)": "I am not sure.",
    "empty turn": "",
}


@dataclass
class CheckReport:
    env: str
    passed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: str | None = None
    """Set when the environment could not be built because a package is missing (an adapter whose
    extra is not installed) or it needs options that have no default (``OptionsRequired``):
    ``agentrl envs check --all`` skips it, a named check fails."""
    limit_s: float = ENV_LIMIT_S
    """How long each call of the environment's code may take (its construction, ``reset``, ``step``,
    the rewards, the solver's demonstrations): a call that has not returned by then is a FAIL line
    naming it, and is abandoned (its daemon thread cannot hold the process)."""

    calls: BoundedCalls = field(default_factory=BoundedCalls, repr=False)
    """Runs the checked calls: all on one helper thread, as a run keeps one episode's calls on
    one thread (docs/environments.md, "Which thread runs what")."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _check(report: CheckReport, what: str, fn: Callable[[], Any]) -> Any:
    try:
        out = bounded(report, what, fn)
    except AssertionError as e:
        report.problems.append(f"{what}: {e}")
        return None
    except Exception as e:
        report.problems.append(f"{what}: raised {type(e).__name__}: {e}")
        return None
    report.passed.append(what)
    return out


def bounded(report: CheckReport, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` under the check's time limit (``CheckReport.limit_s``), as rollouts bound the same code
    (``timeouts.env_step_s``): ``WaitTimeout`` naming the environment and the call past it."""
    setting = f"timeouts.env_step_s={report.limit_s:g}s; agentrl envs check --timeout-s"
    return report.calls.call(fn, report.limit_s, f"environment {report.env!r}: {what}", setting)


def _valid_messages(msgs: Any) -> None:
    checked_messages(msgs, "reset")
    assert msgs, "reset returned no messages"
    for m in msgs:
        assert m["role"] in ("system", "user", "assistant", "tool"), f"unknown role {m['role']!r}"
    json.dumps(msgs)


def _valid_step(result: Any) -> StepResult:
    step = checked_step(result)  # the runner's own check of the contract
    assert step.terminated or step.truncated or step.observation, (
        "a step that does not end the episode must return an observation"
    )
    return step


def check_environment(
    name: str,
    options: dict[str, Any] | None = None,
    seed: int = 0,
    limit_s: float = ENV_LIMIT_S,
    tasks: Sequence[Task] | None = None,
    source: str | None = None,
) -> CheckReport:
    """Check environment ``name``'s contract; each call of its code may take ``limit_s`` seconds.
    ``tasks`` (from ``source``, in words: a run's data, a task file) are checked with instead of
    the built-in ones; without them an environment with no built-in tasks gets a placeholder."""
    options = options or {}
    report = CheckReport(name, limit_s=limit_s)
    try:
        env_cls = type(bounded(report, "constructing it", lambda: make_env(name, **options)))
    except Exception as e:  # the constructor is user code: a FAIL line, like reset and step
        report.problems.append(f"constructing the environment raised {type(e).__name__}: {e}")
        if isinstance(e, (ImportError, OptionsRequired)):
            report.missing = str(e)
        return report
    if tasks is not None and not tasks:
        report.problems.append(f"{source}: no tasks")
        return report
    tasks = _given_tasks(report, tasks, source) or _check_tasks(
        report, env_cls, seed, task_loading_options(env_cls, options, {})
    )
    task = tasks[0] if tasks else Task(id="check", prompt="What is 1 + 1?", answer=2)
    if _is_agent(report, env_cls):  # driven by run(client, task), not reset/step
        return report

    def fresh() -> Environment:
        env = make_env(name, **options)
        _valid_messages(env.reset(task, seed))
        return env

    env = _check(report, "reset returns chat messages", fresh)
    if env is None:
        return report
    _check(report, "tool schemas are well-formed", lambda: _schemas(env))
    _check(report, "rewards() returns Reward records", lambda: _rewards(env))
    bounded_close(report, env)

    for label, action in SCRIPTED_BAD_ACTIONS.items():
        env = _fresh_env(report, name, options, task, seed, f"step survives: {label}")
        if env is None:  # the next ones would fail (or wait) the same way
            return report
        hung = len(report.problems)
        _check(report, f"step survives: {label}", functools.partial(_step_checked, env, action))
        bounded_close(report, env)
        if len(report.problems) > hung and "no answer after waiting" in report.problems[-1]:
            break  # each further step could wait as long
    _check_demonstrations(report, name, options, env_cls, tasks or [task], seed)
    env = _fresh_env(report, name, options, task, seed, "close() is idempotent")
    if env is not None:
        _check(report, "close() is idempotent", functools.partial(_close_twice, env))
    return report


def _is_agent(report: CheckReport, env_cls: type[Environment]) -> bool:
    """Whether ``env_cls`` is an ``AgentEnvironment``, whose ``run`` is then all that is checked."""
    from agentrl.agents import AgentEnvironment

    if not issubclass(env_cls, AgentEnvironment):
        return False
    if env_cls.run is AgentEnvironment.run:
        report.problems.append("an AgentEnvironment must define run(client, task)")
    else:
        report.passed.append("run(client, task) is defined")
    report.notes.append("an agent environment: reset/step are not checked (the agent drives its episodes)")
    return True


def _given_tasks(report: CheckReport, tasks: Sequence[Task] | None, source: str | None) -> list[Task] | None:
    """The first ``DEMO_TASKS`` of the tasks given (``--data``, ``--config``), said in the report."""
    if not tasks:
        return None
    shown = min(len(tasks), DEMO_TASKS)
    report.passed.append(f"{len(tasks)} tasks from {source} load; checked with the first {shown}")
    return list(tasks[:DEMO_TASKS])


def _fresh_env(
    report: CheckReport, name: str, options: dict[str, Any], task: Task, seed: int, before: str
) -> Environment | None:
    """A new environment reset on ``task`` for the check ``before``, its construction and ``reset``
    under the check's time limit (``bounded``); None, with a FAIL line naming the call, when they
    raise or do not return (a reset that works once and hangs later must not hang the check)."""
    what = f"reset of a new environment (for {before!r})"

    def fresh() -> Environment:
        env = make_env(name, **options)
        env.reset(task, seed)
        return env

    try:
        return bounded(report, what, fresh)
    except Exception as e:
        report.problems.append(f"{what}: raised {type(e).__name__}: {e}")
        return None


def bounded_close(report: CheckReport, env: Environment) -> None:
    """``env.close()`` under the check's time limit; what it raises is the close check's to report."""
    try:
        bounded(report, "close()", env.close)
    except WaitTimeout as e:
        report.problems.append(f"close(): raised WaitTimeout: {e}")
    except Exception:
        pass


def _check_tasks(
    report: CheckReport, env_cls: type[Environment], seed: int, task_options: dict[str, Any]
) -> list[Task] | None:
    """The built-in splits load and do not overlap; returns up to ``DEMO_TASKS`` training tasks to
    check with.
    ``task_options``: the environment options that choose its tasks (``Environment.task_options``)."""
    try:
        # the default sizes a run loads: a small sample would miss a split that shares a few problems
        train = env_cls.load_tasks("train", n=None, seed=seed, **task_options)
        test = env_cls.load_tasks("test", n=None, seed=seed, **task_options)
    except NotImplementedError:
        report.notes.append(
            "no built-in tasks: checked with a placeholder task (give yours: --data FILE, or --config CONFIG)"
        )
        return None
    except Exception as e:
        report.problems.append(f"load_tasks raised {type(e).__name__}: {e}")
        return None
    overlap = sorted({t.id for t in train} & {t.id for t in test})
    overlap += sorted({t.prompt for t in train} & {t.prompt for t in test})
    if overlap:
        report.problems.append(
            f"train and test splits overlap: {len(overlap)} shared id(s) or prompt(s), e.g. {overlap[:3]}"
        )
    elif not train:
        report.problems.append("load_tasks('train') returned no tasks")
    else:
        report.passed.append(
            f"built-in tasks load: {len(train)} train and {len(test)} test, no id or prompt in both"
        )
        return train[:DEMO_TASKS]
    return None


def _check_demonstrations(
    report: CheckReport,
    name: str,
    options: dict[str, Any],
    env_cls: type[Environment],
    tasks: list[Task],
    seed: int,
) -> None:
    """The solver's demonstrations of ``tasks`` replay through ``step`` and score above zero: one
    line saying how many replayed, and a FAIL line for each that does not."""
    try:
        demos = bounded(report, "demonstrations()", lambda: env_cls.demonstrations(tasks, seed=seed))
    except NotImplementedError:
        report.notes.append("no solver demonstrations: replay check skipped")
        return
    except Exception as e:
        report.problems.append(f"demonstrations() raised {type(e).__name__}: {e}")
        return
    checked = list(zip(tasks, demos))
    replayed, failures = _replay_all(report, name, options, checked, seed)
    report.problems += failures[:SHOWN_FAILURES]
    what = f"{replayed - len(failures)} of {replayed} solver demonstrations replay and score > 0"
    if len(failures) > SHOWN_FAILURES:
        what += f" ({len(failures) - SHOWN_FAILURES} more failures not shown)"
    if replayed < len(checked):
        what += f" (the last did not return: the other {len(checked) - replayed} were not replayed)"
    if len(checked) < len(tasks):
        what += f" (the solver returned {len(demos)} for {len(tasks)} tasks)"
    (report.problems if failures or not checked else report.passed).append(what)


def _replay_all(
    report: CheckReport,
    name: str,
    options: dict[str, Any],
    checked: list[tuple[Task, list[dict]]],
    seed: int,
) -> tuple[int, list[str]]:
    """(how many replayed, why each that failed did) for the (task, demonstration) pairs; a replay
    that does not return within the check's time limit stops the rest (each could wait as long)."""
    failures = []
    for i, (t, demo) in enumerate(checked):
        replay = functools.partial(_replay, name, options, t, demo, seed)
        try:
            bounded(report, f"replaying demonstration {i} (task {t.id!r})", replay)
        except Exception as e:
            why = str(e) if isinstance(e, AssertionError) else f"raised {type(e).__name__}: {e}"
            failures.append(f"demonstration {i} (task {t.id!r}): {why}")
            if isinstance(e, WaitTimeout):
                return i + 1, failures
    return len(checked), failures


def _rewards(env: Environment) -> None:
    rewards = env.rewards()
    assert isinstance(rewards, (list, tuple)), (
        f"rewards() returned {type(rewards).__name__}; expected a list of agentrl.env.Reward(name, fn, weight)"
    )
    for r in rewards:
        assert isinstance(r, Reward), f"rewards() holds {r!r}; expected agentrl.env.Reward(name, fn, weight)"


def _step_checked(env: Environment, action: str) -> StepResult:
    return _valid_step(env.step(action))


def _close_twice(env: Environment) -> None:
    env.close()
    env.close()


def _schemas(env: Environment) -> None:
    for s in env.tool_schemas():
        fn = s.get("function", {})
        assert fn.get("name"), f"tool schema without a name: {s}"
        assert fn.get("description"), f"tool {fn.get('name')!r} has no description (write a docstring)"
        json.dumps(s)


def _replay(name: str, options: dict[str, Any], task: Task, demo: list[dict], seed: int) -> None:
    env = make_env(name, **options)
    try:
        first = env.reset(task, seed)
        assert demo[: len(first)] == first, "the demonstration does not start with what reset returns"
        messages = list(first)
        i, info, reward = len(first), {}, 0.0
        final_text = None
        while i < len(demo):
            assert demo[i]["role"] == "assistant", (
                f"expected an assistant message at {i}, got {demo[i]['role']}"
            )
            final_text = demo[i]["content"]
            messages.append(demo[i])
            obs, r, terminated, truncated, step_info = _valid_step(env.step(final_text))
            reward += r
            info.update(step_info)
            i += 1
            got = [m["content"] for m in obs]
            want = [m["content"] for m in demo[i : i + len(obs)]]
            assert got == want, f"tool output differs from the demonstration: {got!r} vs {want!r}"
            messages.extend(obs)
            i += len(obs)
            if terminated or truncated:
                assert i == len(demo), "the episode ended before the demonstration did"
        state = EpisodeState(task, messages, final_text, info)
        total = reward
        for fn in env.rewards():
            try:
                total += fn.weight * reward_value(repr(fn.name), fn.fn(task, state))
            except Exception as e:
                raise AssertionError(f"reward {fn.name!r} raised {type(e).__name__}: {e}") from e
        assert total > 0, f"the solver's demonstration earns reward {total}"
    finally:
        env.close()


def format_report(report: CheckReport) -> str:
    lines = [f"environment {report.env!r}: {'OK' if report.ok else 'FAILED'}"]
    lines += [f"  ok    {_shown(p)}" for p in report.passed]
    lines += [f"  note  {_shown(n)}" for n in report.notes]
    lines += [f"  FAIL  {_shown(p)}" for p in report.problems]
    return "\n".join(lines)


def _shown(line: str) -> str:
    """``line`` as a report prints it: its first ``LINE_CHARS`` characters and its length when longer
    (a FAIL line can hold a tool's whole output)."""
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_CHARS]}... ({len(line):,} characters)"
