#!/usr/bin/env bash
# Install, prepare the optional test infrastructure (a private Docker engine and headless Chromium;
# tests that need them skip with the reason printed when they cannot start), run the test suite
# (default tier plus the docker, browser, ray and slow tiers), then the vLLM tier in its own
# virtual environment (scripts/test_vllm.sh; it prints why when vLLM cannot be installed).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow and not ray"` for a quick run.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
eval "$(bash .ci/docker_setup.sh)"
bash .ci/browser_setup.sh .venv/bin/python >&2
status=0
.venv/bin/python -m pytest -m "not vllm and not study" -q "$@" || status=$?
bash .ci/docker_setup.sh stop
if [ "$status" -eq 0 ] && [ "$#" -eq 0 ]; then
  bash scripts/test_vllm.sh || status=$?
fi
exit $status
