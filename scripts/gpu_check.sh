#!/usr/bin/env bash
# The GPU check: runs the tests marked `gpu` (tests/test_gpu.py) when torch sees a CUDA device, and
# says why it skips otherwise. Uses .venv (bash scripts/setup.sh) when present, else python3 (the GPU
# machine's own torch and transformers; its wheels for the rest: docs/scaling.md). The scale path's
# one-GPU part (a Ray worker sharing the GPU, weights over CUDA IPC) needs ray: without it that test
# skips saying so. Extra arguments go to pytest. Not part of .ci/run: CI machines have no GPU.
# It also runs the parts of the multi-GPU path one GPU can show (an NCCL group of one rank, pinned CPU
# offload, the KL reference under FSDP2, the helper threads on CUDA); what needs vLLM or more GPUs is
# scripts/gpu_check_multi.sh. What it gave on the GPUs it ran on: docs/scaling.md. What the GPU
# machine lacks (Ray, omegaconf): scripts/gpu_bundle.sh check.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  why=$("$PY" -c "import torch; print(f'torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no CUDA device')" 2>&1 | tail -1)
  echo "gpu_check: skipped: $why"
  exit 0
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, transformers; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, transformers {transformers.__version__}')"
"$PY" -c "import importlib.util as u; print('ray', 'installed' if u.find_spec('ray') else 'not installed: the Ray worker test will skip')"
exec "$PY" -m pytest -m gpu -v -s -p no:cacheprovider --durations=0 tests/test_gpu.py "$@"
