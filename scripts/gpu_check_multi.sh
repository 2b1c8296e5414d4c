#!/usr/bin/env bash
# The multi-GPU check, for a node of yours with 2 or more GPUs and vLLM installed (pip install -e
# '.[vllm]'): what one GPU cannot show (docs/scaling.md, "Beyond one process per GPU"). No machine
# here has two GPUs and the GPU machine cannot install vLLM, so none of these has run yet.
#
#   bash scripts/gpu_check_multi.sh            # every check the node's GPUs allow
#   bash scripts/gpu_check_multi.sh --dry-run  # print the commands only
#
# Each check is one short `agentrl train` (a tiny model built locally, test_crashy, 2 steps) and
# passes when the run exits 0 and what it proves holds; a check that needs more GPUs than the node
# has is skipped, saying so. What each proves (review numbers: docs/scaling.md):
#   colocated_tp1  2 GPUs  FSDP2, a vLLM engine per rank (external_launcher), the bucketed NCCL
#                          gather; every rank's sync verified; each rank's process on its own GPU only
#   colocated_tp2  2 GPUs  one vLLM engine of tensor_parallel_size 2 over the two ranks (exit 0)
#   sleep_level2   2 GPUs  vLLM's sleep mode at level 2 (torch's cache emptied before each wake: #3)
#   sleep_lora     2 GPUs  the same with LoRA: every weight sent after the wake, syncs verified (#4)
#   async_threads  2 GPUs  rollout.runner=async and trainer.mode=async: rank 1's process on GPU 1
#                          only (helper threads on the rank's device: #7)
#   offload        2 GPUs  FSDP2 with pinned CPU offload and a KL reference, then a resume on 1 GPU
#                          (DCP resharding; the reference's shards only on each GPU: #6, #10)
#   ray_broadcast  3 GPUs  2 trainer ranks and a vLLM Ray worker on GPU 2, weights over NCCL
#                          broadcast, collective_s shorter than the worker's start (#1, #2, #14)
#   ray_tp2        3 GPUs  1 trainer rank and a vLLM worker of tensor_parallel_size 2 on GPUs 1-2:
#                          a bucket copied to each of its GPUs (#16; exit 0: the worker's process
#                          holds a context on both of its GPUs by design)
# Passing looks like: "PASS <name>" for each check and "gpu_check_multi: N passed, 0 failed".
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
SCRATCH=$(mktemp -d)
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$DRY" = 0 ] && [ "$GPUS" -lt 2 ]; then
  echo "gpu_check_multi: skipped: torch sees $GPUS GPU(s); these checks need 2 or more (1: scripts/gpu_check.sh)"
  exit 0
fi
if [ "$DRY" = 0 ] && ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "gpu_check_multi: skipped: vLLM does not import here (pip install -e '.[vllm]')"
  exit 0
fi
[ "$DRY" = 1 ] && GPUS=8
TINY="$SCRATCH/tiny"
[ "$DRY" = 0 ] && "$PY" -c "from agentrl.models import build_tiny_model, train_tokenizer as t; build_tiny_model('$TINY', 'h128-L8', tokenizer=t(), seed=0)" >/dev/null
C=(model.path="$TINY" env.name=test_crashy env.module=tests/helpers/distributed_envs.py run.device=cuda
  rollout.prompts_per_step=4 rollout.group_size=4 rollout.max_tokens_per_turn=16 rollout.max_episode_tokens=96
  trainer.micro_batch_size=4 trainer.total_steps=2 logging.tensorboard=false logging.plots=false sft.enabled=false
  rollout.engine=vllm rollout.vllm.gpu_memory_utilization=0.3)
TORCHRUN=("$PY" -m torch.distributed.run --nnodes 1 --master_addr 127.0.0.1)
passed=0 failed=0 skipped=0

# every compute process on the GPUs, as "pid gpu_uuid" lines, sampled while a run trains
watch_gpus() { while sleep 5; do nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null; done >> "$1"; }

# verified RUN: every rank's metrics say each sync was verified
verified() {
  "$PY" - "$1" <<'EOF'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
files = [run / "metrics.jsonl", *sorted(run.glob("ranks/*/metrics.jsonl"))]
rows = [json.loads(x) for f in files for x in f.read_text().splitlines()]
bad = [r.get("step") for r in rows if r.get("sync/verified") != 1.0]
print(f"  {len(files)} rank(s), {len(rows)} step rows, unverified steps: {bad}")
sys.exit(1 if bad or not rows else 0)
EOF
}

# one_gpu_each LOG: no process appears on two GPUs
one_gpu_each() {
  "$PY" - "$1" <<'EOF'
import collections, sys
seen = collections.defaultdict(set)
for line in open(sys.argv[1]):
    if "," in line:
        pid, uuid = (x.strip() for x in line.split(",")[:2])
        seen[pid].add(uuid)
many = {p: sorted(u) for p, u in seen.items() if len(u) > 1}
print(f"  {len(seen)} process(es) seen on the GPUs; on more than one GPU: {many or 'none'}")
sys.exit(1 if many or not seen else 0)
EOF
}

# check NAME GPUS_NEEDED RUN_DIR COMMAND... ; the proofs after it run as POST (a function name)
check() {
  local name=$1 need=$2 run=$3 post=$4
  shift 4
  if [ "$GPUS" -lt "$need" ]; then
    echo "SKIP $name: needs $need GPUs, torch sees $GPUS"
    skipped=$((skipped + 1))
    return
  fi
  echo "== $name: $*"
  [ "$DRY" = 1 ] && return
  local log="$SCRATCH/$name.gpus"
  : > "$log"
  watch_gpus "$log" & local watcher=$!
  "$@" > "$SCRATCH/$name.log" 2>&1
  local rc=$?
  kill "$watcher" 2>/dev/null
  if [ "$rc" = 0 ] && "$post" "$run" "$log"; then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name (exit $rc; log: $SCRATCH/$name.log)"
    tail -20 "$SCRATCH/$name.log"
    failed=$((failed + 1))
  fi
}

post_verified() { verified "$1" && one_gpu_each "$2"; }
post_one_gpu() { one_gpu_each "$2"; }
post_exit() { true; }
post_offload() {
  "$PY" -m agentrl.cli train --resume "$1" trainer.total_steps=3 > "$SCRATCH/offload_resume.log" 2>&1 \
    && grep -q "resumed on 1" "$SCRATCH/offload_resume.log" && echo "  resumed on 1 GPU: resharded"
}

R="$SCRATCH/runs"
check colocated_tp1 2 "$R/tp1" post_verified "${TORCHRUN[@]}" --nproc_per_node 2 -m agentrl.cli train "${C[@]}" \
  trainer.strategy=fsdp2 rollout.sync.verify=every run.output_dir="$R/tp1"
check colocated_tp2 2 "$R/tp2" post_exit "${TORCHRUN[@]}" --nproc_per_node 2 -m agentrl.cli train "${C[@]}" \
  rollout.vllm.tensor_parallel_size=2 rollout.sync.verify=off run.output_dir="$R/tp2"
check sleep_level2 2 "$R/sleep2" post_verified "${TORCHRUN[@]}" --nproc_per_node 2 -m agentrl.cli train "${C[@]}" \
  rollout.colocate.sleep=true rollout.colocate.sleep_level=2 rollout.sync.verify=every run.output_dir="$R/sleep2"
check sleep_lora 2 "$R/sleep_lora" post_verified "${TORCHRUN[@]}" --nproc_per_node 2 -m agentrl.cli train "${C[@]}" \
  rollout.colocate.sleep=true rollout.colocate.sleep_level=2 rollout.sync.verify=every model.lora.rank=8 \
  run.output_dir="$R/sleep_lora"
check async_threads 2 "$R/async" post_one_gpu "${TORCHRUN[@]}" --nproc_per_node 2 -m agentrl.cli train "${C[@]}" \
  rollout.runner=async trainer.mode=async rollout.max_staleness=1 algorithm.is_correction=tis run.output_dir="$R/async"
check offload 2 "$R/offload" post_offload "${TORCHRUN[@]}" --nproc_per_node 2 -m agentrl.cli train "${C[@]}" \
  rollout.engine=hf trainer.strategy=fsdp2 trainer.fsdp.cpu_offload=true trainer.bf16=true algorithm.kl_coef=0.01 \
  trainer.checkpoint_every=1 run.output_dir="$R/offload"
check ray_broadcast 3 "$R/ray" post_verified "${TORCHRUN[@]}" --nproc_per_node 2 -m agentrl.cli train "${C[@]}" \
  rollout.workers=1 rollout.vllm.gpu_memory_utilization=0.8 rollout.sync.transport=broadcast rollout.sync.verify=every \
  trainer.strategy=fsdp2 timeouts.collective_s=20 run.output_dir="$R/ray"
check ray_tp2 3 "$R/ray_tp2" post_exit "${TORCHRUN[@]}" --nproc_per_node 1 -m agentrl.cli train "${C[@]}" \
  rollout.workers=1 rollout.worker_gpus=2 rollout.vllm.tensor_parallel_size=2 rollout.sync.verify=off \
  rollout.sync.transport=broadcast run.output_dir="$R/ray_tp2"

echo "gpu_check_multi: $passed passed, $failed failed, $skipped skipped (logs: $SCRATCH)"
[ "$failed" = 0 ]
