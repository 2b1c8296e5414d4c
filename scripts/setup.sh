#!/usr/bin/env bash
# Create .venv and install agentrl with its dev tools and the adapters' packages (reasoning-gym,
# textarena, openenv-core; the tests use them). torch 2.13.0 (CPU) goes first, by pip (it reads this
# machine's pip configuration, which may point at a local wheel): with it installed, the project's
# torch range is satisfied without downloading a multi-GB CUDA build.
# The rest is installed by uv (from PyPI, into .venv), which fetches and unpacks in parallel, the
# same versions as pip (`time bash scripts/setup.sh` in a fresh clone on the 2-core AVX2 machine,
# 2026-11-29: 35 s, against ~61 s with pip). Where uv cannot be installed or fails, pip installs
# them, saying so.
# No bytecode at install (pip's --no-compile, uv's default): it is written on first import instead of
# for every installed file, which makes a fresh install much faster.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS="dev,reasoning-gym,textarena,openenv"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
with_pip() { .venv/bin/python -m pip install -q --no-compile -e ".[$EXTRAS]"; }
if ! .venv/bin/python -m pip install -q --no-compile uv >/dev/null 2>&1; then
  echo "setup: uv could not be installed from PyPI; pip installs agentrl's dependencies (slower)" >&2
  with_pip
elif ! .venv/bin/uv pip install -q --python .venv/bin/python -e ".[$EXTRAS]"; then
  echo "setup: uv could not install agentrl's dependencies (above); pip installs them instead" >&2
  with_pip
fi
