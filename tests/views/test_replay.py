"""agentrl replay: terminal rendering of recorded episodes, --rerun and --rescore."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from agentrl.env import Environment, EpisodeState, Reward, Task, register, tool
from agentrl.episode import Episode, Segment
from agentrl.errors import Failure
from agentrl.tools import format_tool_call
from agentrl.transcripts import TranscriptWriter
from agentrl.views.replay import replay_command, rerun_episode, rescore_episode
from tests.helpers import DATA
from tests.helpers.user_files import one_turn_env

RUN = DATA / "transcripts" / "run"


def console() -> Console:
    return Console(file=io.StringIO(), width=120, color_system=None)


def out(c: Console) -> str:
    return c.file.getvalue()  # type: ignore[attr-defined]


@register
class ReplayCalc(Environment):
    """Test-only environment: an ``add`` tool (with an ``offset`` option to simulate changed code)
    and a reward that checks the final answer."""

    name = "test_replay_calc"
    offset = 0

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first.
            b: second.
        """
        if a < 0:
            raise ValueError("negative input")
        return a + b + self.offset

    def rewards(self):
        def correct(task: Task, state: EpisodeState) -> float:
            return float(state.final_text is not None and str(task.answer) in state.final_text)

        def turns(task: Task, state: EpisodeState) -> float:
            return float(sum(m["role"] == "assistant" for m in state.messages))

        return [Reward("correct", correct), Reward("turns", turns, weight=0.0)]


def record(a: int, b: int, replies: list[str], ep_id: str = "e0") -> Episode:
    """Drive the environment with scripted replies the way the runner does and record the episode."""
    task = Task(f"add-{a}-{b}", f"What is {a} + {b}?", answer=a + b)
    env = ReplayCalc()
    msgs = env.reset(task, seed=3)
    ep = Episode(id=ep_id, env=ReplayCalc.name, task_id=task.id, seed=3, step=1)
    ep.metrics["task"] = {"id": task.id, "prompt": task.prompt, "answer": task.answer, "metadata": {}}
    ep.add(Segment("prompt", 0, [1, 2], msgs[-1]["content"]))
    for turn, text in enumerate(replies):
        msgs.append({"role": "assistant", "content": text})
        ep.add(Segment("policy", turn, [3, 4], text, logprobs=[-0.5, -0.25], weight_version=0))
        try:
            obs = env.step(text)
        except Exception as e:
            ep.failure, ep.stop_reason = Failure("tool", str(e)), "error"
            break
        for m in obs.observation:
            ep.add(Segment("tool", turn + 1, [5], m["content"]))
        msgs.extend(obs.observation)
        if obs.terminated:
            ep.stop_reason = "answered"
            break
    ep.messages = msgs
    state = EpisodeState(task, msgs, replies[-1] if ep.stop_reason == "answered" else None, {})
    ep.reward_components = {r.name: r.fn(task, state) for r in env.rewards()}
    ep.reward = sum(r.weight * ep.reward_components[r.name] for r in env.rewards())
    return ep


GOOD = [f"Let me add. {format_tool_call('add', {'a': 2, 'b': 3})}", "The answer is 5."]


def test_replay_renders_roles_tool_calls_and_failure_boundary():
    c = console()
    assert replay_command(str(RUN), filter="failure=tool", console=c) == 0
    text = out(c)
    assert "episode t23+20-s4-g1-1" in text
    assert "FAILED at the tool boundary" in text and "sandbox died" in text
    assert "tool call" in text and '"name": "add"' in text  # the call is framed
    assert "tool output · turn 1" in text and "policy · turn 0" in text
    assert "stop reason error" in text and "torn last line" in text  # the warning is shown, not fatal
    assert text.count("episode t") == 1


def test_replay_selects_by_episode_step_and_limit():
    c = console()
    assert replay_command(str(RUN), episode="t24+7-s5-g2-0", console=c) == 0
    assert "stop reason max_turns" in out(c) and "environment · turn 2" in out(c)
    c = console()
    assert replay_command(str(RUN), step=2, limit=3, console=c) == 0
    assert out(c).count("─ episode ") == 3 and "more episodes match" in out(c)
    assert replay_command(str(RUN), filter="reward>5", console=console()) == 2  # nothing matched
    assert replay_command(str(RUN), filter="nonsense", console=console()) == 2
    assert replay_command(str(RUN / "missing.jsonl"), console=console()) == 2


def test_rerun_and_rescore_identical_episode(tmp_path):
    ep = record(2, 3, GOOD)
    assert ep.reward == 1.0 and ep.stop_reason == "answered"
    assert rerun_episode(ep) == [] and rescore_episode(ep) == []
    path = tmp_path / "t.jsonl"
    with TranscriptWriter(path) as w:
        w.write([ep])
    c = console()
    assert replay_command(str(path), rerun=True, rescore=True, console=c) == 0
    assert "rerun: identical" in out(c) and "rescore: identical" in out(c)


def test_rerun_reports_changed_tool_output_and_env_options(tmp_path):
    ep = record(2, 3, GOOD)
    assert ep.messages[2]["role"] == "tool"  # [user, assistant, tool, assistant]
    ep.messages[2]["content"] = "6"  # the recording says 6; today's tool says 5
    diffs = rerun_episode(ep)
    assert len(diffs) == 1 and "turn 0 message 0 content differs" in diffs[0]
    assert "-6" in diffs[0] and "+5" in diffs[0]
    # With offset=1 (from the run's config.yaml) the tool returns 6 again: identical.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: test_replay_calc\n  options: {offset: 1}\n")
    with TranscriptWriter(run / "transcripts.jsonl") as w:
        w.write([ep])
    c = console()
    assert replay_command(str(run), rerun=True, console=c) == 0, out(c)
    (run / "config.yaml").write_text("env:\n  name: test_replay_calc\n  options: {offset: 0}\n")
    c = console()
    assert replay_command(str(run), rerun=True, console=c) == 1
    assert "rerun: 1 difference(s)" in out(c)


def test_rerun_reproduces_recorded_tool_failure_and_flags_a_new_one():
    bad = record(-1, 3, [format_tool_call("add", {"a": -1, "b": 3})])
    assert bad.failure is not None and bad.failure.boundary == "tool"
    assert rerun_episode(bad) == []  # the recorded failure happens again: not a difference
    bad.failure = None
    diffs = rerun_episode(bad)
    assert len(diffs) == 1 and "step raised ToolError" in diffs[0]


def test_rescore_reports_changed_rewards_and_missing_task(tmp_path):
    ep = record(2, 3, GOOD)
    ep.reward_components["correct"] = 0.0
    ep.reward_components["old_metric"] = 1.0
    diffs = rescore_episode(ep)
    assert "reward 'correct': recorded 0 -> now 1" in diffs
    assert "reward 'old_metric': recorded but no longer computed" in diffs
    ep2 = record(2, 3, GOOD)
    ep2.reward = 0.5  # components agree but the total does not: weighted sum is 1*1 + 0*2 = 1
    assert rescore_episode(ep2) == ["total reward: recorded 0.5 -> weighted sum now 1"]
    del ep2.metrics["task"]
    path = tmp_path / "t.jsonl"
    with TranscriptWriter(path) as w:
        w.write([ep2])
    c = console()
    assert replay_command(str(path), rescore=True, console=c) == 1
    assert "could not rescore: ValueError" in out(c)


@pytest.mark.slow  # 25-56 s: in the full tier (.ci/run), not the fast one
def test_rerun_and_rescore_use_the_runs_env_module(tmp_path, tiny_model_dir):
    """``replay --rerun/--rescore`` of a run whose environment lives in the user's own file: the run's
    ``env.module`` is imported (in a fresh process, as a user runs it), or ``--module`` for a bare
    transcript file. The three replays share one fresh process (each cost ~10 s of imports, issue 51);
    the bare file is another run's, of an environment in another file, so no replay finds the
    environment a previous one imported: the bare file without ``--module`` first, then with it, then
    the run."""
    import json
    import shutil
    import subprocess
    import sys

    from agentrl.assembly import make_trainer
    from agentrl.config import load_config

    def train(name: str) -> tuple[Path, Path]:
        env_file = tmp_path / f"{name}_env.py"
        env_file.write_text(one_turn_env(f"test_{name}_replay"))
        run = tmp_path / name
        cfg = load_config(None, [f"model.path={tiny_model_dir}", f"env.module={env_file}", f"env.name=test_{name}_replay",
                                 f"run.output_dir={run}", "run.device=cpu", "rollout.prompts_per_step=2",
                                 "rollout.group_size=2", "rollout.max_tokens_per_turn=6", "trainer.total_steps=1",
                                 "logging.tensorboard=false", "logging.plots=false"])  # fmt: skip
        make_trainer(cfg, log=lambda *_: None).train()
        return run, env_file

    run, _ = train("units")
    other, other_env = train("others")
    bare = tmp_path / "elsewhere" / "transcripts.jsonl"
    bare.parent.mkdir()
    shutil.copy(other / "transcripts.jsonl", bare)

    flags = ["--rerun", "--rescore", "--limit", "1"]
    calls = [["replay", str(bare), *flags], ["replay", str(bare), "--module", str(other_env), *flags],
             ["replay", str(run), *flags]]  # fmt: skip
    script = (
        "import json, sys\n"
        "from agentrl.cli import main\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    print('<<replay>>', flush=True)\n"
        "    print(f'<<exit {main(args)}>>', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(calls)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    no_module, with_module, of_run = proc.stdout.split("<<replay>>")[1:]
    assert "could not rerun" in no_module, no_module  # no run config, no module: it cannot know
    assert "<<exit 0>>" in with_module and "rescore: identical" in with_module, with_module[-2000:]
    assert "<<exit 0>>" in of_run, of_run[-2000:]
    assert "rerun: identical" in of_run and "rescore: identical" in of_run, of_run[-2000:]
