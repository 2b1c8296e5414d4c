"""A tiny MCP tool server for tests/env/test_mcp.py, written with the ``mcp`` package's ``MCPServer``.

    python tests/helpers/mcp_server.py               # serve over stdio (what an environment's command starts)
    python tests/helpers/mcp_server.py --port 8123   # serve streamable HTTP on http://127.0.0.1:8123/mcp

Tools: ``add`` (a result), ``echo``, ``fail`` (a tool error), ``sleep`` (a hung tool), ``crash`` (the
process dies mid-call), ``pid`` and ``spawn`` (a grandchild in its own session), so a test can check
that no process is left after ``close_all``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("agentrl-test-tools", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail(message: str) -> str:
    """Always fail, with the given message."""
    raise ToolError(message)  # an anticipated failure: the client reads the message


@server.tool()
async def sleep(seconds: float) -> str:
    """Wait this many seconds, then answer."""
    await anyio.sleep(seconds)
    return f"slept {seconds:g}s"


@server.tool()
def crash() -> str:
    """Kill the server process at once (no reply is ever sent)."""
    os._exit(3)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def spawn() -> int:
    """Start a long-lived child process in a new session (outside our process group); its pid."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    return child.pid


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=None, help="serve streamable HTTP on 127.0.0.1:PORT")
    args = parser.parse_args()
    if args.port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
