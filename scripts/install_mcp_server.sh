#!/usr/bin/env bash
# Install an MCP server from PyPI into its own virtual environment, the recipe of docs/environments.md
# ("An MCP server from PyPI"): the server's `mcp` pin never touches agentrl's .venv.
#   bash scripts/install_mcp_server.sh mcp-server-time==2026.10.19 .venv-mcp-time
# then point the environment at it: MCPServer("time", command=[".venv-mcp-time/bin/mcp-server-time"]).
# The suite's tests/env/test_mcp_pypi.py uses exactly this (scripts/test.sh runs it in the background).
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:?usage: install_mcp_server.sh PACKAGE[==VERSION] VENV}"
venv="${2:?usage: install_mcp_server.sh PACKAGE[==VERSION] VENV}"
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$spec"
echo "$venv ready: $("$venv/bin/python" -m pip show "${spec%%[=<>]*}" 2>/dev/null | grep -m1 '^Version')"
