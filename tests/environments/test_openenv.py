"""The openenv adapter on an environment we did not write: the echo environment of openenv-core's own
``openenv init`` template, served by its own app, stepped through openenv's client. Also its servers
(a pool that grows to ``max_servers``, a dead server replaced), the Docker path with a recording fake,
actions as text or JSON, and a short training run (scripts/test.sh installs the openenv extra)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.assembly import make_trainer
from agentrl.config import load_config
from agentrl.env import make_env
from agentrl.env.check import check_environment
from agentrl.episode import Episode
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None,
    reason="openenv-core is not installed here: pip install 'agentrl[openenv]' (scripts/test.sh does)",
)


@pytest.fixture(scope="module")
def echo_project(tmp_path_factory) -> str:
    """``openenv init echo_env``: openenv-core's template, written offline, not edited."""
    out = tmp_path_factory.mktemp("openenv")
    cli = Path(sys.executable).parent / "openenv"
    subprocess.run(
        [str(cli), "init", "echo_env", "-o", str(out)], check=True, capture_output=True, timeout=120
    )
    return str(out / "echo_env")


@pytest.mark.slow
def test_the_template_echo_environment_runs_unchanged(echo_project):
    env = make_env("openenv", project=echo_project, max_servers=2)
    tasks = env.load_tasks("train", 2, seed=0)
    try:
        system, first = env.reset(tasks[0], 0)
        assert "'message'" in system["content"]  # the action's only required string field
        assert json.loads(first["content"]) == {
            "echoed_message": "Echo Env environment ready!",
            "message_length": 0,
        }
        obs, reward, done, truncated, _ = env.step("Hello")
        assert (reward, done, truncated) == (pytest.approx(0.5), False, False)  # 0.1 per character
        assert json.loads(obs[0]["content"])["echoed_message"] == "Hello"
    finally:
        env.close()
    report = check_environment("openenv", {"project": echo_project, "max_servers": 2})
    assert report.ok, report.problems


@pytest.mark.slow
def test_a_dead_server_fails_its_episode_and_is_replaced(echo_project):
    env = make_env("openenv", project=echo_project, max_servers=2)
    task = env.load_tasks("train", 1, seed=1)[0]
    env.reset(task, 0)
    (server,) = [s for s in env._pool.servers if s.url == env._server]
    server.process.kill()
    server.process.wait()
    with pytest.raises(Exception):  # noqa: B017 (the runner fails the episode at env on whatever it is)
        env.step("anyone there?")
    env.close()
    env.reset(task, 0)  # a new server replaces the dead one
    try:
        assert server not in env._pool.servers and env.step("back")[1] == pytest.approx(0.4)
    finally:
        env.close()


def test_sessions_beyond_the_servers_capacity_are_refused_naming_the_options():
    from environments.adapters.openenv_servers import Pool

    pool = Pool({"url": "http://127.0.0.1:9", "start_timeout_s": 1}, sessions_per_server=2, max_servers=8)
    assert pool.acquire() == pool.acquire() == "http://127.0.0.1:9"
    with pytest.raises(RuntimeError, match=r"all 2 OpenEnv sessions are in use.*max_servers"):
        pool.acquire()
    pool.release("http://127.0.0.1:9")
    assert pool.acquire() == "http://127.0.0.1:9"


def test_actions_are_text_or_json_and_a_bad_reply_is_feedback():
    from environments.adapters.openenv import last_json_object, observation_text, text_field

    env = make_env("openenv", url="http://127.0.0.1:9")  # nothing connects until reset
    env._schema = {"title": "Move", "properties": {"row": {"type": "integer"}, "col": {"type": "integer"}},
                   "required": ["row", "col"]}  # fmt: skip
    env._field = text_field(env._schema)
    assert env._field is None  # no string field: the reply must be a JSON object
    assert env.action('I play {"row": 1} no, {"row": 2, "col": 0}.') == {"row": 2, "col": 0}
    assert "not an action" in env.action("row two, column zero") and "['col', 'row']" in env.action("?")
    assert text_field({"properties": {"message": {"type": "string"}}, "required": ["message"]}) == "message"
    assert last_json_object("{bad json}") is None
    assert observation_text({"board": "x.o", "reward": 1.0, "done": False}, None) == '{"board": "x.o"}'
    with pytest.raises(KeyError, match="no field 'text'"):
        observation_text({"board": "x.o"}, "text")


def test_one_source_is_required_and_envs_check_all_skips_it(capsys):
    from agentrl.errors import OptionsRequired

    with pytest.raises(OptionsRequired, match="exactly one of"):
        make_env("openenv")
    with pytest.raises(OptionsRequired, match=r"\['url', 'image'\]"):
        make_env("openenv", url="http://127.0.0.1:9", image="x")
    assert check_environment("openenv").missing  # envs check --all: SKIPPED, with this reason


def test_the_docker_path_publishes_on_loopback_and_labels_its_container(monkeypatch):
    from environments.adapters import openenv_servers
    from sandboxes import docker as docker_backend

    calls = []

    class API:
        def __getattr__(self, name):
            def record(*args, **kwargs):
                calls.append((name, args, kwargs))
                answers = {"create_host_config": {"bindings": kwargs}, "create_container": {"Id": "c1"},
                           "port": [{"HostIp": "127.0.0.1", "HostPort": "49153"}]}  # fmt: skip
                return answers.get(name)

            return record

    client = type("Client", (), {"api": API()})()
    monkeypatch.setattr(docker_backend, "connect", lambda url=None: client)
    monkeypatch.setattr(docker_backend, "reap", lambda c: calls.append(("reap", (), {})) or 0)
    monkeypatch.setattr(
        openenv_servers, "wait_healthy", lambda url, timeout, alive: calls.append(("health", (url,), {}))
    )
    server = openenv_servers.ContainerServer("my-env:latest", 8000, 30.0)
    server.close()
    names = [c[0] for c in calls]
    assert names == [
        "reap",
        "create_host_config",
        "create_container",
        "start",
        "port",
        "health",
        "remove_container",
    ]
    assert calls[1][2] == {"port_bindings": {8000: ("127.0.0.1", None)}}  # never on every interface
    image, kwargs = calls[2][1][0], calls[2][2]
    assert image == "my-env:latest" and kwargs["ports"] == [8000]
    assert set(kwargs["labels"]) == {docker_backend.LABEL, docker_backend.OWNER_LABEL}  # reaped if orphaned
    assert server.url == "http://127.0.0.1:49153" and calls[-1][2] == {"force": True}


@pytest.mark.slow
def test_the_example_config_trains_on_it(tmp_path, tiny_model_dir, echo_project):
    cfg = load_config(ROOT / "configs/examples/openenv_cpu.yaml", [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'run'}", f"env.options.project={echo_project}",
        "env.options.max_servers=2", "trainer.total_steps=2", "rollout.prompts_per_step=1", "rollout.group_size=2",
        "rollout.max_turns=2", "rollout.max_tokens_per_turn=8", "logging.tensorboard=false", "logging.plots=false",
        "algorithm.dynamic_sampling=false"])  # fmt: skip
    make_trainer(cfg, log=lambda *_: None).train()
    episodes = [
        Episode.from_json(x) for x in (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()
    ]
    assert len(episodes) == 4 and all(e.failure is None for e in episodes), [e.failure for e in episodes]
    # two actions of up to 8 tokens each, 0.1 per echoed character; never done: the turn budget ends it
    assert all(e.reward > 0 and e.reward_components["finished"] == 0.0 for e in episodes)
    assert all(e.stop_reason == "max_turns" for e in episodes)
