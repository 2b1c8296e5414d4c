"""User code runs under the rollouts' limits wherever a command calls it: a tool, a reward and a
``reset`` that never return (tests/helpers/hanging_env.py), in each place that runs them.

=========================  ======================  =====================  ======================
place                      tool                    reward                 reset
=========================  ======================  =====================  ======================
training preflight         solver's demos: error   not called (passes)    solver's demos: error
``envs check``             solver's demos: FAIL    demo replay: FAIL      first and later: FAIL
SFT demonstrations         solver: WaitTimeout     not called (passes)    solver: WaitTimeout
``agentrl eval``           episodes fail (3)       episodes fail (3)      episodes fail (3)
evaluation in training     its episodes fail       its episodes fail      its episodes fail
``agentrl rollout``        episodes fail (3)       episodes fail (3)      episodes fail (3)
agent environments         in ``run``              episodes fail (3)      episodes fail (3)
``agentrl serve``          preflight: error (2)    never called           preflight: error (2)
=========================  ======================  =====================  ======================

Outside rollouts the limit is ``timeouts.env_step_s`` (``envs check``: ``--timeout-s``), and the
error names the environment and the call; a tool inside an episode has its environment's
``tool_timeout_s``. tests/test_exit.py runs some of these as commands of their own, for the exit."""

from __future__ import annotations

import os
import threading
import time

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.env.check import check_environment
from tests.helpers import HELPERS
from tests.helpers.configs import hanging_config, small_config

HANGING = HELPERS / "hanging_env.py"


def test_a_solver_that_never_returns_is_a_config_error_before_any_work(tmp_path, tiny_model_dir):
    """Before: ``agentrl train`` with a calculator whose tool looped forever never created its run
    directory and never printed a line (the preflight called the solver with no limit)."""
    from agentrl.assembly import make_trainer

    cfg = small_config(
        tmp_path, tiny_model_dir, "env.name=hanging_solver", f"env.module={HANGING}", "sft.enabled=true",
        "timeouts.env_step_s=1",
    )  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        make_trainer(cfg, log=lambda *_: None)
    assert time.monotonic() - t0 < 30
    message = str(err.value)
    assert "environment 'hanging_solver': demonstrations() of" in message, message
    assert "no answer after waiting 1.0s (limit: timeouts.env_step_s=1s)" in message, message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("env", "hang", "what"), [
    ("hanging", "reset", "reset"),
    ("hanging", "step", "step"),
    ("hanging_solver", "none", "demonstrations()"),  # the solver calls the tool itself
    ("hanging_solver", "reward", "replaying demonstration 0 (task 'train-0')"),  # the replay scores it
])  # fmt: skip
def test_envs_check_names_a_call_that_never_returns(env, hang, what):
    load_config(None, [f"env.module={HANGING}"])  # imports (registers) the test environments
    t0 = time.monotonic()
    report = check_environment(env, {"hang": hang} if hang != "none" else {}, limit_s=0.5)
    assert not report.ok and time.monotonic() - t0 < 30
    hung = [p for p in report.problems if "no answer after waiting" in p]
    assert hung and any(what in p for p in hung), report.problems
    assert all(f"environment '{env}'" in p and "--timeout-s" in p for p in hung), hung


@pytest.mark.parametrize("hang", ["tool", "reset", "reward"])
def test_the_preflight_bounds_the_solver_wherever_it_hangs(tmp_path, tiny_model_dir, hang):
    """The preflight runs the solver (its reset and tool calls) under ``timeouts.env_step_s``; it
    scores nothing, so a reward that never returns does not stop it (rollouts bound that one)."""
    from agentrl.assembly.preflight import check_inputs

    cfg = small_config(
        tmp_path, tiny_model_dir, "env.name=hanging_solver", f"env.module={HANGING}", "sft.enabled=true",
        f"env.options.hang={hang}", "timeouts.env_step_s=1",
    )  # fmt: skip
    t0 = time.monotonic()
    if hang == "reward":
        assert check_inputs(cfg, train=True, sft=True).train_tasks
    else:
        with pytest.raises(ConfigError) as err:
            check_inputs(cfg, train=True, sft=True)
        message = str(err.value)
        assert "environment 'hanging_solver': demonstrations() of" in message, message
        assert "no answer after waiting 1.0s (limit: timeouts.env_step_s=1s)" in message, message
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("hang", ["tool", "reset", "reward"])
def test_the_warm_starts_demonstrations_are_bounded_wherever_the_solver_hangs(tmp_path, tiny_model_dir, hang):
    """The SFT warm start's data generation (``build_examples``, past the preflight: a solver that
    hangs only now) bounds the solver as the preflight does; it scores nothing."""
    from transformers import AutoTokenizer

    from agentrl.assembly.sft import build_examples
    from agentrl.timeouts import WaitTimeout

    cfg = small_config(
        tmp_path, tiny_model_dir, "env.name=hanging_solver", f"env.module={HANGING}", "sft.enabled=true",
        f"env.options.hang={hang}", "timeouts.env_step_s=1", "sft.num_demos=4",
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    t0 = time.monotonic()
    if hang == "reward":
        assert len(build_examples(cfg, tokenizer, log=lambda *_: None)) == 4
    else:
        with pytest.raises(WaitTimeout) as err:
            build_examples(cfg, tokenizer, log=lambda *_: None)
        message = str(err.value)
        assert message.startswith("environment 'hanging_solver': demonstrations() of 4 task(s)"), message
        assert "(limit: timeouts.env_step_s=1s)" in message, message
    assert time.monotonic() - t0 < 30


def test_envs_check_names_a_reset_that_hangs_only_after_the_first(monkeypatch):
    """Before: ``envs check`` bounded its first ``reset`` but not the later ones (a new environment
    for each scripted bad action, and for the close check): a reset that hung the second time hung
    the command. Now each is bounded and named, and the check stops at the first."""
    monkeypatch.setattr(_hanging_class(), "_resets_returned", [0])
    t0 = time.monotonic()
    report = check_environment("hanging", {"hang": "later_reset"}, limit_s=0.5)
    assert not report.ok and time.monotonic() - t0 < 30
    assert "reset returns chat messages" in report.passed
    hung = [p for p in report.problems if "no answer after waiting" in p]
    assert len(hung) == 1, report.problems
    assert "environment 'hanging': reset of a new environment (for 'step survives: malformed JSON" in hung[0]


def _hanging_class() -> type:
    """The ``hanging`` environment's class as the commands load it (``env.module``: imported from its
    path, not as ``tests.helpers.hanging_env``)."""
    from agentrl.env import registered

    load_config(None, [f"env.module={HANGING}"])
    return registered()["hanging"]


@pytest.mark.parametrize(("command", "hang", "said"), [
    # the tool times out (its output says so), then the reward never returns: the episode fails at
    # the reward boundary. tests/test_exit.py runs two of these as commands of their own (the exit).
    ("rollout", "tool,reward", "reward 'correct' did not return: environment 'hanging' rewards: no answer"),
    ("eval", "tool,reward", "reward 'correct' did not return: environment 'hanging' rewards: no answer"),
    ("rollout", "reset", "environment 'hanging' reset: no answer after waiting 1.0s"),
    ("eval", "reset", "environment 'hanging' reset: no answer after waiting 1.0s"),
])  # fmt: skip
def test_eval_and_rollout_fail_the_episodes_whose_code_hangs(
    tmp_path, tiny_model_dir, capsys, monkeypatch, command, hang, said
):
    """Each episode is bounded as in training (the tool by ``tool_timeout_s``, reset and the rewards by
    ``timeouts.env_step_s``): the command ends, and says every episode failed and where (exit 3)."""
    from agentrl.cli.main import main

    hanging = _hanging_class()
    monkeypatch.setattr(hanging, "_tool_outputs", [])
    args = ["--tasks", "2"] if command == "rollout" else []
    t0 = time.monotonic()
    status = main([command, hanging_config(tmp_path, tiny_model_dir, hang), *args])
    err = capsys.readouterr().err
    assert status == 3 and time.monotonic() - t0 < 60, err
    assert said in err, err
    if "tool" in hang:  # each tool call ended at its limit, and the episode went on to its reward
        outputs = hanging._tool_outputs
        assert len(outputs) == (4 if command == "rollout" else 2), outputs  # 2 tasks × 2 samples; × eval.k=1
        assert set(outputs) == {"Error: tool 'wait' timed out after 0.5s"}, outputs


@pytest.mark.parametrize("hang", ["tool,reward", "reset"])
def test_a_training_runs_evaluation_fails_the_episodes_whose_code_hangs(
    tmp_path, tiny_model_dir, monkeypatch, hang
):
    """Only the held-out tasks hang (``hang_split=test``): the step trains, its evaluation
    (``trainer.eval_every``) is bounded as the rollouts are, and its episodes fail naming the call."""
    from agentrl.assembly import trainer as trainer_module

    seen = []

    def evaluate(*args, **kwargs):
        metrics, episodes = real(*args, **kwargs)
        seen.extend(episodes)
        return metrics, episodes

    real = trainer_module.evaluate
    monkeypatch.setattr(trainer_module, "evaluate", evaluate)
    hanging = _hanging_class()
    monkeypatch.setattr(hanging, "_tool_outputs", [])
    path = hanging_config(
        tmp_path, tiny_model_dir, hang, env={"options": {"hang": hang, "hang_split": "test"}},
        trainer={"total_steps": 1, "eval_every": 1},
    )  # fmt: skip
    t0 = time.monotonic()
    history = trainer_module.make_trainer(load_config(path, []), log=lambda *_: None).train()
    assert time.monotonic() - t0 < 60
    assert history[-1]["eval/failed_frac"] == 1.0 and len(seen) == 2, history[-1]
    said = (
        "reward 'correct' did not return: environment 'hanging' rewards: no answer after waiting 1.0s"
        if "reward" in hang
        else "environment 'hanging' reset: no answer after waiting 1.0s"
    )
    assert all(said in e.failure.message for e in seen), [e.failure for e in seen]
    if "tool" in hang:  # training's 4 calls returned, evaluation's 2 ended at their limit
        assert sorted(hanging._tool_outputs) == ["1"] * 4 + ["Error: tool 'wait' timed out after 0.5s"] * 2


@pytest.mark.parametrize("hang", ["tool", "reset"])
def test_serve_refuses_a_solver_that_hangs_before_serving(tmp_path, tiny_model_dir, capsys, hang):
    """``agentrl serve`` runs the config's environment code only in its preflight and warm start (the
    solver's demonstrations, bounded): a hang there is a config error naming the environment and the call."""
    from agentrl.cli.main import main

    path = hanging_config(
        tmp_path, tiny_model_dir, hang, env={"name": "hanging_solver"}, sft={"enabled": True}
    )
    t0 = time.monotonic()
    assert main(["serve", path, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 30
    assert "environment 'hanging_solver': demonstrations() of" in err, err
    assert "no answer after waiting 1.0s (limit: timeouts.env_step_s=1s)" in err, err


def test_a_served_episode_runs_none_of_the_environments_code(tmp_path, tiny_model_dir):
    """A served episode is the client's: the config's environment (whose tool, reset, step and reward
    all hang here) is constructed by the preflight only; its reward is the one the client posts."""
    import signal

    import httpx

    from agentrl.cli.main import main
    from agentrl.episode import Episode
    from tests.helpers.configs import free_port

    port = free_port()
    path = hanging_config(tmp_path, tiny_model_dir, "tool,reset,step,reward")
    answers: dict = {}

    def client() -> None:
        base = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    httpx.get(f"{base}/models", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            headers = {"X-Episode-Key": "ep-1"}
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            answers["chat"] = httpx.post(f"{base}/chat/completions", json=chat, headers=headers, timeout=30)
            answers["finish"] = httpx.post(f"{base}/episodes/ep-1/finish", json={"reward": 0.5}, timeout=30)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # serve stops as on Ctrl-C

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=client, daemon=True)
    try:
        thread.start()
        t0 = time.monotonic()
        assert main(["serve", path, "--port", str(port)]) == 0
        assert time.monotonic() - t0 < 60
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    thread.join(10)
    assert answers["chat"].status_code == 200, answers["chat"].text
    assert answers["finish"].json()["reward"] == 0.5, answers["finish"].text
    lines = (tmp_path / "run" / "serve" / "transcripts.jsonl").read_text().splitlines()
    (episode,) = map(Episode.from_json, lines)
    assert episode.env == "serve" and not episode.failed and episode.reward == 0.5


@pytest.mark.parametrize(("hang", "said"), [
    # a blocking call inside the agent's coroutine holds the agents' loop: no agent's own limit fires
    ("tool", "the agents' event loop did not return within 4s (timeouts.agent_run_s=2s per agent"),
    ("reset", "environment 'hanging_agent' reset: no answer after waiting 1.0s"),
    ("reward", "reward 'correct' did not return: environment 'hanging_agent' rewards: no answer"),
    # rewards() itself, read first to see whether a run that returned None has rewards at all
    ("rewards", "environment 'hanging_agent' rewards: no answer after waiting 1.0s"),
])  # fmt: skip
def test_an_agent_environments_code_is_bounded_as_in_rollouts(tmp_path, tiny_model_dir, capsys, hang, said):
    """The agent runner (``AgentEnvironment``: train, eval, rollout) bounds the environment's
    construction and ``reset`` as the lockstep runner does, and the agents' loop as a whole. Before:
    a reset that never returned hung ``agentrl rollout`` before any agent ran, and so did a tool that
    never returned called in an async ``run`` (``timeouts.agent_run_s`` is enforced on the loop the
    tool blocked)."""
    from agentrl.cli.main import main

    path = hanging_config(
        tmp_path,
        tiny_model_dir,
        hang,
        env={"name": "hanging_agent"},
        timeouts={"agent_run_s": 2} if hang == "tool" else {},
    )
    t0 = time.monotonic()
    assert main(["rollout", path, "--tasks", "2"]) == 3
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 60
    assert said in err, err
