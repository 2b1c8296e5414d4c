"""User code outside rollouts runs under the rollouts' limits: the preflight's and the SFT warm
start's solver demonstrations (``timeouts.env_step_s``), and every call ``envs check`` makes
(construction, ``reset``, ``step``, the solver's demonstrations and their replay; ``--timeout-s``). A call that never
returns is named and abandoned instead of hanging the command before any work."""

from __future__ import annotations

import time

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.env.check import check_environment
from tests.helpers import HELPERS
from tests.helpers.configs import small_config

HANGING = HELPERS / "hanging_env.py"


def test_a_solver_that_never_returns_is_a_config_error_before_any_work(tmp_path, tiny_model_dir):
    """Before: ``agentrl train`` with a calculator whose tool looped forever never created its run
    directory and never printed a line (the preflight called the solver with no limit)."""
    from agentrl.training.trainer import Trainer

    cfg = small_config(
        tmp_path, tiny_model_dir, "env.name=hanging_solver", f"env.module={HANGING}", "sft.enabled=true",
        "timeouts.env_step_s=1",
    )  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        Trainer(cfg, log=lambda *_: None)
    assert time.monotonic() - t0 < 30
    message = str(err.value)
    assert "environment 'hanging_solver': demonstrations() of" in message, message
    assert "no answer after waiting 1.0s (limit: timeouts.env_step_s=1s)" in message, message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("env", "hang", "what"), [
    ("hanging", "reset", "reset"),
    ("hanging", "step", "step"),
    ("hanging_solver", "none", "demonstrations()"),
])  # fmt: skip
def test_envs_check_names_a_call_that_never_returns(env, hang, what):
    load_config(None, [f"env.module={HANGING}"])  # imports (registers) the test environments
    t0 = time.monotonic()
    report = check_environment(env, {"hang": hang} if hang != "none" else {}, limit_s=0.5)
    assert not report.ok and time.monotonic() - t0 < 30
    hung = [p for p in report.problems if "no answer after waiting" in p]
    assert hung and any(what in p for p in hung), report.problems
    assert all(f"environment '{env}'" in p and "--timeout-s" in p for p in hung), hung
