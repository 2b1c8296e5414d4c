"""Issue 66, item 7: a real MCP server from PyPI, installed the way docs/environments.md says (its
own virtual environment, pointed at by ``command=``), serves an environment's tools; and a client
``mcp`` that a server's install downgraded is named when the environment is built, not reported as a
server that "did not start and list its tools within 20s"."""

from __future__ import annotations

import importlib.metadata
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from agentrl.assembly.preflight import check_inputs
from agentrl.config import ConfigError, load_config
from agentrl.env import Environment, Reward, register
from agentrl.env.mcp_tools import MCPServer, MCPServerError, client_problem, close_all
from agentrl.tools import ToolCall

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / ".venv-mcp-time" / "bin" / "mcp-server-time"  # bash scripts/install_mcp_server.sh


@register
class TimeTools(Environment):
    name = "test_mcp_time"
    system_prompt = "Answer with the current hour in UTC as \\boxed{H}. Use the tools."
    mcp_servers = (MCPServer("time", command=[str(SERVER), "--local-timezone", "UTC"], startup_timeout_s=60),)

    def rewards(self):
        return [Reward("answered", lambda task, state: float(state.final_text is not None))]


def test_mcp_server_time_from_pypi_in_its_own_venv_serves_the_tools():
    if not SERVER.exists():
        pytest.skip(
            f"{SERVER} is not installed: bash scripts/install_mcp_server.sh mcp-server-time .venv-mcp-time"
        )
    env = TimeTools()
    try:
        assert {"get_current_time", "convert_time"} <= set(env.tool_names())
        schema = next(s for s in env.tool_schemas() if s["function"]["name"] == "get_current_time")
        assert "timezone" in json.dumps(schema)
        reply = env.call_tool(ToolCall("get_current_time", {"timezone": "UTC"}))
        out = json.loads(reply["content"])
        assert (
            out["timezone"] == "UTC"
            and abs(datetime.fromisoformat(out["datetime"]).year - datetime.now().year) <= 1
        )
        bad = env.call_tool(ToolCall("get_current_time", {"timezone": "Mars/Olympus"}))
        assert bad["content"].startswith("Error:"), bad  # the server's error is feedback
    finally:
        env.close()
        close_all()


def test_a_downgraded_mcp_client_is_named_when_the_environment_is_built(monkeypatch, tmp_path):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda p: "1.30.0" if p == "mcp" else real(p))
    problem = client_problem()
    assert problem and "MCP tools need mcp>=2.3, and mcp 1.30.0 is installed here" in problem
    assert "its own environment" in problem and "An MCP server from PyPI" in problem
    cfg = load_config(
        None, ["env.name=test_mcp_time", f"run.output_dir={tmp_path / 'run'}", "sft.enabled=false"]
    )
    with pytest.raises(
        ConfigError, match=re.escape("'test_mcp_time' has MCP servers: MCP tools need mcp>=2.3")
    ):
        check_inputs(cfg)
    env = TimeTools()
    try:  # a path without the config check (serve, envs check) says the same at the first tool list
        with pytest.raises(MCPServerError, match=re.escape("mcp 1.30.0 is installed here")):
            env.tool_names()
    finally:
        env.close()
    monkeypatch.setattr(importlib.metadata, "version", real)
    assert client_problem() is None
