"""`agentrl envs check`: every registered environment passes; a broken one is caught, clearly."""

from __future__ import annotations

import pytest

from agentrl.cli import main
from agentrl.env import Environment, StepResult, Task, register, registered
from agentrl.env_check import check_environment


@pytest.mark.parametrize("name", sorted(registered()))
def test_every_registered_environment_passes(name):
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
