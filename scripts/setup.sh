#!/usr/bin/env bash
# Create .venv and install agentrl with its dev tools and the adapters' packages (reasoning-gym,
# textarena, openenv-core; the tests use them). torch 2.13.0 (CPU) goes first: with it installed, the project's
# torch range is satisfied without downloading a multi-GB CUDA build.
# --no-compile: bytecode is written on first import instead of for every installed file, which
# makes a fresh install much faster.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
.venv/bin/python -m pip install -q --no-compile -e ".[dev,reasoning-gym,textarena,openenv]"
