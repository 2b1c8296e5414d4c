#!/usr/bin/env bash
# Install, then train a tiny model with STARE in the multi-turn calculator environment on CPU
# (supervised warm start built on first use, then RL). Extra arguments are config overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/agentrl train configs/quickstart.yaml "$@"
