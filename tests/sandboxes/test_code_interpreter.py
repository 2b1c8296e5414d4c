"""The code-interpreter environment driven by scripted actions on each available backend, plus the
sandbox pieces the environment relies on (pool, factory, unisolated refusal, start-up reaping)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from agentrl.env import EpisodeState, Task
from environments.code_interpreter import CodeInterpreter
from sandboxes import (
    IsolationUnavailable,
    Limits,
    SandboxError,
    SandboxSpec,
    SessionPool,
    close_shared_pools,
    make_sandbox,
    shared_pool,
)
from sandboxes.e2b_local import LocalCodeInterpreterServer
from tests.helpers.sandbox_fixtures import (
    FAST,
    assert_nothing_left,
    docker_options,
    make_or_skip,
    our_containers,
)

LIMITS = FAST.replace(wall_s=1.0).to_json()


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker), "e2b"])
def env(request):
    backend, extra, cleanup = request.param, {}, []
    if backend == "e2b":
        inner = make_or_skip("bwrap", FAST.replace(wall_s=1.0))
        server = LocalCodeInterpreterServer(inner)
        extra = {"debug": True, "sandbox_url": server.url}
        cleanup = [server.close, inner.close]
    elif backend == "docker":
        make_or_skip("docker").close()  # skips with the reason when there is no engine
        extra = docker_options()
    e = CodeInterpreter(sandbox=SandboxSpec(backend, {"limits": LIMITS, **extra}))
    yield e
    e.close()
    close_shared_pools()
    for fn in cleanup:
        fn()
    assert_nothing_left()


def test_scripted_episode(env):
    task = Task(id="t1", prompt="What is 6 * 7?", answer=42)
    first = env.reset(task, seed=0)
    assert first[-1] == {"role": "user", "content": "What is 6 * 7?"} and first[0]["role"] == "system"
    # a code block runs; the printed output comes back as a tool message
    obs, _, term, trunc, _ = env.step("Let me compute.\n```python\nx = 6 * 7\nprint(x)\n```")
    assert obs == [{"role": "tool", "name": "python", "content": "42"}] and not term and not trunc
    # a crashing cell is feedback, not a failure
    obs, *_ = env.step("```python\n1 / 0\n```")
    assert "ZeroDivisionError: division by zero" in obs[0]["content"]
    # a cell past the time limit is feedback too
    obs, _, term, _, _ = env.step("```python\nwhile True:\n    pass\n```")
    assert "TimeoutError" in obs[0]["content"] and not term
    # the last expression's value is shown; state survives (E2B restarts after a timeout)
    obs, *_ = env.step("```python\nx + 0\n```")
    assert obs[0]["content"] == "42" or env.sandbox.backend == "e2b"
    # an unclosed block is a parse error for the model
    obs, *_ = env.step("```python\nprint(1)")
    assert obs[0]["content"].startswith("Error: the code block is not closed")
    # no code block: the final answer
    final = "So the answer is \\boxed{42}."
    obs, _reward, term, trunc, info = env.step(final)
    assert obs == [] and term and info["answer"] == "42"
    state = EpisodeState(task=task, messages=[], final_text=final, info=info)
    scores = {r.name: r.fn(task, state) for r in env.rewards()}
    assert scores["correct"] == 1.0 and scores["has_answer"] == 1.0
    env.close()
    env.close()  # idempotent


def test_wrong_answer_scores_zero():
    task = Task(id="t", prompt="?", answer=42)
    state = EpisodeState(task=task, messages=[], final_text="\\boxed{41}", info={})
    assert CodeInterpreter().rewards()[0].fn(task, state) == 0.0


def test_sandbox_failure_raises_for_the_sandbox_boundary():
    env = CodeInterpreter(sandbox=SandboxSpec("bwrap", {"limits": LIMITS, "python": "/nonexistent/python3"}))
    with pytest.raises(SandboxError) as e:
        env.reset(Task(id="t", prompt="?"), 0)
    assert e.value.boundary == "sandbox"
    env.close()
    close_shared_pools()


def test_tasks_and_demonstrations_run_in_the_sandbox():
    tasks = CodeInterpreter.load_tasks("train", n=3, seed=0)
    env = CodeInterpreter(sandbox=SandboxSpec("bwrap", {"limits": LIMITS}))
    for demo, task in zip(CodeInterpreter.demonstrations(tasks), tasks):
        env.reset(task, 0)
        obs, *_ = env.step(demo[-3]["content"])  # the demo's code block, run for real
        assert obs[0]["content"] == demo[-2]["content"] == str(task.answer)
        env.close()
    close_shared_pools()


def test_unisolated_refuses_without_opt_in():
    with pytest.raises(IsolationUnavailable, match="allow_unisolated"):
        make_sandbox("unisolated")
    with pytest.warns(RuntimeWarning, match="UNISOLATED"):
        sb = make_sandbox("unisolated", allow_unisolated=True, limits=FAST)
    with sb:
        assert sb.run("1 + 1").value == "2"
    assert_nothing_left()


def test_unknown_backend():
    with pytest.raises(ValueError, match="valid: bwrap, docker, e2b, unisolated"):
        make_sandbox("firecracker")


def test_pool_bounds_and_reaps():
    sb = make_or_skip("bwrap")
    pool = SessionPool(sb, max_sessions=2, spares=1)
    a, b = pool.acquire(), pool.acquire()
    assert pool.in_use() == 2
    with pytest.raises(SandboxError, match="no session free"):
        pool.acquire(timeout=0.1)
    a.run("v = 1")
    a.close()
    with pool.acquire(timeout=5) as c:
        assert c.run("v").error.name == "NameError"  # a fresh session: nothing leaks between episodes
    pool.close()  # closes b (still handed out) and the spare
    assert b.closed
    sb.close()
    assert_nothing_left()


def test_limits_defaults():
    lim = Limits()
    assert (lim.wall_s, lim.cpu_s, lim.memory_bytes, lim.processes, lim.output_bytes, lim.file_bytes) == (
        10.0, 10.0, 512 << 20, 64, 64 << 10, 16 << 20,
    )  # fmt: skip


def test_file_size_limit():
    with make_or_skip("bwrap") as sb:
        r = sb.run("open('big', 'wb').write(b'x' * (2 << 20))")  # FAST.file_bytes is 1 MiB
        assert r.error is not None and r.error.name == "OSError" and "File too large" in r.error.value


def test_cgroup_orphans_are_reaped_at_start_up():
    from sandboxes import cgroups

    mgr = cgroups.detect()
    if mgr is None:
        pytest.skip("cgroups are not writable here")
    orphan = [r / cgroups.BASE / "999999999-1-0" for r in mgr.roots.values()]
    for d in orphan:
        d.mkdir(exist_ok=True)
    assert mgr.reap_orphans() >= 1
    assert not any(d.exists() for d in orphan)


@pytest.mark.docker
def test_docker_containers_reaped_at_exit_and_start_up():
    sb = make_or_skip("docker")
    sb.close()
    # a client that exits without closing: the atexit hook removes its container
    code = textwrap.dedent(f"""
        from sandboxes import make_sandbox
        sb = make_sandbox("docker", **{docker_options()!r})
        s = sb.session(); s.run("1")
        print(sb.owner)
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=os.getcwd()
    )
    owner = out.stdout.strip()
    assert owner, out.stderr
    from sandboxes.docker import LABEL, OWNER_LABEL, connect, reap

    client = connect(docker_options().get("base_url"))
    assert client.api.containers(all=True, filters={"label": f"{OWNER_LABEL}={owner}"}) == []
    # a container left by a crashed owner (a pid that is not running) is removed at start-up
    host = os.uname().nodename
    c = client.api.create_container(
        "agentrl-sandbox:local",
        command=["/usr/bin/true"],
        labels={LABEL: "1", OWNER_LABEL: f"{host}:999999999:1"},
    )
    assert reap(client) >= 1
    assert all(x["Id"] != c["Id"] for x in client.api.containers(all=True))
    assert our_containers() == []


def test_the_runs_sandbox_section_reaches_every_environment(tmp_path):
    from agentrl.assembly import components
    from agentrl.config import load_config

    cfg = load_config(
        None,
        ["env.name=code_interpreter", "sandbox.warm_sessions=2", "sandbox.limits.wall_s=3",
         "rollout.max_concurrent_episodes=5"],
    )  # fmt: skip
    spec = components.sandbox_spec(cfg)
    assert (spec.backend, spec.warm_sessions, spec.max_sessions) == ("bwrap", 2, 5)
    assert spec.options["limits"]["wall_s"] == 3
    env = components.env_factory(cfg)()
    assert env.sandbox == spec  # passed explicitly, not probed for
    calc = components.env_factory(load_config(None, ["env.name=calculator"]))()
    assert calc.sandbox.backend == "bwrap"  # every environment gets one; those that run no code ignore it
    try:
        env.reset(Task(id="t", prompt="?"), 0)
        pool = shared_pool(spec)
        assert (pool.spares, pool.max_sessions, pool.in_use()) == (2, 5, 1)
    finally:
        env.close()
        close_shared_pools()
    assert_nothing_left()


def test_pool_size_is_an_alias_of_warm_sessions():
    from agentrl.config import ConfigError, config_from_dict, load_config

    with pytest.warns(FutureWarning, match=r"sandbox\.warm_sessions"):
        cfg = load_config(None, ["sandbox.pool_size=3"])
    assert cfg.sandbox.warm_sessions == 3
    with pytest.raises(ConfigError, match=r"set only 'sandbox\.warm_sessions'"):
        config_from_dict({"sandbox": {"pool_size": 3, "warm_sessions": 1}})  # both in one file
