#!/usr/bin/env bash
# Install, prepare the optional test infrastructure (a private Docker engine and headless Chromium;
# tests that need them skip with the reason printed when they cannot start), then run the tests:
# the default suite plus the docker, browser and slow tiers. vLLM tests run in their own venv
# (scripts/test_vllm.sh) and are not part of this command.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
eval "$(bash .ci/docker_setup.sh)"
bash .ci/browser_setup.sh .venv/bin/python >&2
status=0
.venv/bin/python -m pytest -m "not vllm" -q "$@" || status=$?
bash .ci/docker_setup.sh stop
exit $status
