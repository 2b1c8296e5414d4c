"""MCP tool servers (agentrl/env/mcp_tools.py): the schema in the prompt, a call, a tool error, a hung tool,
a crashed server (the episode fails at the tool boundary, the run goes on), no leftover processes.

The server is tests/helpers/mcp_server.py, started over stdio by the pool (or over HTTP by the test)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Environment, Reward, Task, register, tool
from agentrl.env.mcp_tools import MCPServer, MCPServerError, close_all, pools
from agentrl.rollout.runner import Budgets, EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.tools import ToolCall, format_tool_call
from sandboxes.process import descendants
from tests.helpers import HELPERS
from tests.helpers.configs import free_port

SERVER = str(HELPERS / "mcp_server.py")
MATH = MCPServer("math", command=[sys.executable, SERVER], timeout_s=1.0)
TASK = Task(id="m1", prompt="What is 2 + 3?", answer="5")


@register
class MathTools(Environment):
    name = "test_mcp_math"
    mcp_servers = (MATH,)

    @tool
    def square(self, x: int) -> int:
        """Square a number.

        Args:
            x: the number.
        """
        return x * x

    def rewards(self):
        return [Reward("answered", lambda task, state: float(state.final_text is not None))]


def call(name, **args):
    return format_tool_call(name, args) + "<|im_end|>"


def run(tokenizer, script, env_factory=MathTools, n=1):
    runner = EpisodeRunner(
        ScriptedEngine(script, tokenizer=tokenizer),
        tokenizer,
        env_factory,
        RunnerSettings(budgets=Budgets(max_turns=6)),
    )
    try:
        return runner.run([EpisodeRequest(TASK, seed=i) for i in range(n)])
    finally:
        runner.close()


def tool_outputs(ep):
    return [m["content"] for m in ep.messages if m["role"] == "tool"]


def server_processes() -> list[int]:
    """Our descendants running tests/helpers/mcp_server.py."""
    out = []
    for pid in descendants(os.getpid()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        if SERVER in cmd:
            out.append(pid)
    return out


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan may wait a while for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def gone_soon(pid: int, within_s: float = 5.0) -> bool:
    """The process stops running within ``within_s`` (the pipe closes just before the exit ends)."""
    deadline = time.monotonic() + within_s
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every test ends with close_all(): afterwards no server process of ours is left."""
    yield
    close_all()
    assert pools() == [] and server_processes() == []


def test_the_schema_is_in_the_prompt_and_a_call_returns_the_result(tiny_tokenizer):
    schemas = MathTools().tool_schemas()
    add = next(s for s in schemas if s["function"]["name"] == "add")
    # tests/helpers/mcp_server.py: add(a: int, b: int) -> int, docstring "Add two integers."
    assert add["type"] == "function" and add["function"]["description"] == "Add two integers."
    params = add["function"]["parameters"]
    assert params["type"] == "object" and params["required"] == ["a", "b"]
    assert {k: v["type"] for k, v in params["properties"].items()} == {"a": "integer", "b": "integer"}
    assert [s["function"]["name"] for s in schemas] == [  # @tool methods first, then the server's
        "square",
        "add",
        "echo",
        "fail",
        "sleep",
        "crash",
        "pid",
        "spawn",
    ]

    (ep,) = run(tiny_tokenizer, [call("add", a=2, b=3), call("square", x=5), "\\boxed{5}<|im_end|>"])
    assert ep.failure is None and ep.stop_reason == "answered", ep.failure
    assert json.dumps(add) in ep.segments[0].text  # the chat template got the server's schema
    assert ep.metrics["tools"] == schemas
    assert [s.text for s in ep.segments if s.role == "tool"] == ["5", "25"]
    assert ep.metrics["tool_calls"] == 2

    env = MathTools()  # environments stay copyable and picklable: the server lives in the pool
    for twin in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        assert twin.call_tool(ToolCall("add", {"a": 40, "b": 2}))["content"] == "42"
    (pool,) = pools()
    assert len(pool.pids) == 1  # one server for the listing, the episode and the copies


def test_a_tool_error_and_a_hung_tool_are_feedback_and_the_session_goes_on(tiny_tokenizer):
    MathTools().tool_schemas()  # start the server outside the timed part
    script = [
        call("fail", message="disk full"),
        call("sleep", seconds=30),
        call("add", a=1, b=1),
        call("add", a="x", b=1),
        call("no_such_tool"),
        "\\boxed{2}<|im_end|>",
    ]
    t0 = time.perf_counter()
    (ep,) = run(tiny_tokenizer, script)
    took = time.perf_counter() - t0
    assert ep.failure is None and ep.stop_reason == "answered", ep.failure
    failed, hung, added, bad_args, unknown = tool_outputs(ep)
    assert failed.startswith("Error:") and "disk full" in failed
    assert hung == "Error: tool 'sleep' timed out after 1s"
    assert 1.0 <= took < 3.0  # timeout_s=1 plus the other calls, not the 30 s sleep
    assert added == "2"  # the same session still answers after the timeout
    assert bad_args.startswith("Error: ") and "valid integer" in bad_args  # the server's own check
    assert unknown.startswith("Error: unknown tool 'no_such_tool'") and "add, crash, echo" in unknown
    (ep,) = run(tiny_tokenizer, [call("add", a=3, b=4), "\\boxed{7}<|im_end|>"])  # the next episode too
    assert tool_outputs(ep) == ["7"] and len(pools()[0].pids) == 1


def test_the_per_call_timeout_comes_from_env_options_as_a_dict(tiny_tokenizer):
    spec = {"name": "math", "command": [sys.executable, SERVER], "timeout_s": 0.5}
    env = MathTools(mcp_servers=[spec])
    t0 = time.perf_counter()
    reply = env.call_tool(ToolCall("sleep", {"seconds": 30}))
    assert reply["content"] == "Error: tool 'sleep' timed out after 0.5s"
    assert env.call_tool(ToolCall("sleep", {"seconds": 0.1}))["content"] == "slept 0.1s"
    assert time.perf_counter() - t0 < 8.0  # start-up (~1-2 s) + 0.5 s + 0.1 s


def test_a_crashed_server_fails_the_episode_at_the_tool_boundary_and_is_restarted(tiny_tokenizer):
    def script(prompt, i):  # episode 0 crashes the server, episode 1 answers without tools
        return call("crash") if i == 0 else "\\boxed{5}<|im_end|>"

    crashed, fine = run(tiny_tokenizer, script, n=2)
    assert crashed.failure is not None and crashed.failure.boundary == "tool"
    assert (
        "MCPServerError" in crashed.failure.message
        and "lost during a call to 'crash'" in crashed.failure.message
    )
    assert crashed.stop_reason == "error"
    assert fine.failure is None and fine.reward == 1.0  # the batch went on
    (pool,) = pools()
    (first,) = pool.pids
    assert gone_soon(first)

    # the next batch: the first call starts a fresh server process
    eps = run(
        tiny_tokenizer, lambda prompt, i: call("add", a=2, b=3) if i < 2 else "\\boxed{5}<|im_end|>", n=2
    )
    assert all(e.failure is None for e in eps), [e.failure for e in eps]
    assert [tool_outputs(e) for e in eps] == [["5"], ["5"]]
    assert len(pool.pids) == 2 and pool.pids[1] != first and running(pool.pids[1])

    # a server that dies while idle is noticed before the next call, which goes to a fresh one
    os.kill(pool.pids[1], signal.SIGKILL)
    assert gone_soon(pool.pids[1])
    assert MathTools().call_tool(ToolCall("add", {"a": 1, "b": 1}))["content"] == "2"
    assert len(pool.pids) == 3 and running(pool.pids[2])


def test_close_all_leaves_no_server_process_nor_its_children():
    class OtherTools(MathTools):  # a second environment class: a second pool, a second server
        name = "test_mcp_other"

    a, b = MathTools(), OtherTools()
    pids = [int(env.call_tool(ToolCall("pid", {}))["content"]) for env in (a, b)]
    grandchild = int(a.call_tool(ToolCall("spawn", {}))["content"])  # in its own session
    assert len(set(pids)) == 2 and sorted(pids) == sorted(server_processes())
    assert sorted(p for pool in pools() for p in pool.pids) == sorted(pids)
    assert all(running(p) for p in [*pids, grandchild])
    t0 = time.perf_counter()
    close_all()
    assert time.perf_counter() - t0 < 5.0
    assert server_processes() == [] and not any(running(p) for p in [*pids, grandchild])
    # a later use starts afresh
    assert MathTools().call_tool(ToolCall("add", {"a": 1, "b": 2}))["content"] == "3"


def test_a_server_that_cannot_start_fails_the_episode_with_a_clear_message(tiny_tokenizer):
    class Broken(MathTools):
        name = "test_mcp_broken"
        mcp_servers = (MCPServer("gone", command=[sys.executable, "-c", "import sys; sys.exit(3)"]),)

    (ep,) = run(tiny_tokenizer, ["\\boxed{5}<|im_end|>"], env_factory=Broken)
    assert ep.failure is not None and ep.failure.boundary == "tool"
    assert "MCP server 'gone'" in ep.failure.message and "could not start" in ep.failure.message

    class Silent(MathTools):  # never answers the handshake
        name = "test_mcp_silent"
        mcp_servers = (
            MCPServer(
                "silent", command=[sys.executable, "-c", "import time; time.sleep(60)"], startup_timeout_s=1.0
            ),
        )

    t0 = time.perf_counter()
    with pytest.raises(MCPServerError, match=r"'silent'.*did not start .* startup_timeout_s=1s"):
        Silent().tool_schemas()
    assert time.perf_counter() - t0 < 1.0 + 5.0  # the wait, then a bounded stop (stdin EOF, SIGTERM)
    (pool,) = [p for p in pools() if p.spec.name == "silent"]
    assert not any(running(p) for p in pool.pids)


def test_tool_name_clashes_name_both_sides():
    class Clash(MathTools):
        name = "test_mcp_clash"

        @tool
        def add(self, a: int, b: int) -> int:
            """Add."""
            return a + b

    with pytest.raises(
        ValueError, match=r"'add' is both a @tool/extra_tools function and a tool of MCP server 'math'"
    ):
        Clash().tool_schemas()

    class Twice(MathTools):
        name = "test_mcp_twice"
        mcp_servers = (MATH, MCPServer("math2", command=[sys.executable, SERVER]))

    with pytest.raises(ValueError, match=r"'add' is served by both MCP servers 'math' and 'math2'"):
        Twice().tool_schemas()
    with pytest.raises(ValueError, match="server names must be unique"):
        MathTools(mcp_servers=[MATH, MATH]).tool_schemas()


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="exactly one of"):
        MCPServer("x")
    with pytest.raises(ValueError, match="exactly one of"):
        MCPServer("x", command=["srv"], url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="argv list"):
        MCPServer("x", command="python server.py")
    for url in ("http://example.com/mcp", "https://10.0.0.5:8000/mcp", "ftp://127.0.0.1/mcp", "127.0.0.1:80"):
        with pytest.raises(ValueError, match=r"is not a local http\(s\) URL.*no outbound network"):
            MCPServer("remote", url=url)
    for url in (
        "http://127.0.0.1:8000/mcp",
        "http://localhost:1/mcp",
        "http://[::1]:9/mcp",
        "http://127.0.0.2/",
    ):
        assert MCPServer("local", url=url).url == url


def test_a_local_url_server_answers_a_call():
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--port", str(port)])
    try:
        deadline = time.monotonic() + 20
        while True:  # until it listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "the HTTP server did not start"
            time.sleep(0.1)

        class OverHTTP(MathTools):
            name = "test_mcp_http"
            mcp_servers = (MCPServer("math-http", url=f"http://127.0.0.1:{port}/mcp"),)

        env = OverHTTP()
        assert "add" in env.tool_names()
        assert env.call_tool(ToolCall("add", {"a": 20, "b": 22})) == {
            "role": "tool",
            "name": "add",
            "content": "42",
        }
        fail = env.call_tool(ToolCall("fail", {"message": "nope"}))["content"]
        assert fail.startswith("Error:") and "nope" in fail
        (pool,) = pools()
        assert pool.pids == []  # we did not start this server: we neither track nor kill it
    finally:
        proc.terminate()
        proc.wait(timeout=10)
