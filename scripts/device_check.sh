#!/usr/bin/env bash
# One prepared check for a CUDA machine (~10 min): SmolLM2-135M through the whole pipeline with
# the vLLM rollout backend, DDP training over every GPU present in bf16, and HF (bf16) against
# vLLM on the same checkpoint (greedy token-exactness, log-prob agreement).
# Figures and JSON go to $OUT when set, else bench/results/device/.
# Needs: CUDA, and PyPI reachable the first time (make venv vllm-env). Fails at once without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DEST=${OUT:-$REPO/bench/results/device}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rollwise-device.XXXXXX")
mkdir -p "$DEST"
log() { echo "[device_check $(date +%H:%M:%S)] $*"; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "device_check: no CUDA device (nvidia-smi finds no GPU); this check needs one" >&2
  exit 2
fi
NGPU=$(nvidia-smi -L | grep -c '^GPU')
log "$NGPU GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"

# The project venv takes the CPU torch wheel (Makefile); training here needs CUDA torch, so the
# CUDA build replaces it (same version). vLLM keeps its own environment (stack-notes.md).
make venv vllm-env >"$WORK/install.log" 2>&1 || { tail -50 "$WORK/install.log"; exit 1; }
PY=$REPO/.venv/bin/python
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  TORCH=$($PY -c "import torch; print(torch.__version__.split('+')[0])")
  log "installing CUDA torch $TORCH into .venv"
  $PY -m pip install --force-reinstall --no-deps "torch==$TORCH" \
    --index-url https://download.pytorch.org/whl/cu128 >>"$WORK/install.log" 2>&1 ||
    $PY -m pip install --force-reinstall --no-deps "torch==$TORCH" >>"$WORK/install.log" 2>&1
fi
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "device_check: torch in .venv cannot see CUDA" >&2; exit 2; }

export HF_HUB_OFFLINE=1 DVC_NO_ANALYTICS=1 MLFLOW_DISABLE_TELEMETRY=true \
  PREFECT_SERVER_ANALYTICS_ENABLED=false RAY_AUTH_MODE=disabled \
  ROLLWISE_VLLM_CMD="$REPO/.venv-vllm/bin/vllm" \
  GIT_AUTHOR_NAME=device GIT_AUTHOR_EMAIL=device@localhost \
  GIT_COMMITTER_NAME=device GIT_COMMITTER_EMAIL=device@localhost

# 1. The bundled SmolLM2, converted once to an HF folder (what the warm start does).
log "materializing SmolLM2-135M-Instruct"
PYTHONPATH=$REPO/src $PY -c "
from pathlib import Path
from rollwise.policy.build import materialize_model
print(materialize_model('SmolLM2-135M-Instruct', Path('$WORK/smollm2')))"

# 2. The pipeline on CUDA: vLLM rollouts, DDP bf16 LoRA training over all GPUs, 2 rounds.
log "pipeline: dvc repro in $WORK/project"
mkdir -p "$WORK/project"
cp -r src tasks flows dvc.yaml "$WORK/project/"
cat >"$WORK/project/params.yaml" <<EOF
envs: {seed: 0, n_envs: 4, owners_per_env: 4, max_records: 2, tasks_per_env: 16,
       heldout_envs: 1, heldout_task_frac: 0.2}
policy: {model: $WORK/smollm2, max_context: 1024, tools_format: compact}
schedule: {method: random, tasks_per_round: 16, seed: 0}
rollout: {backend: vllm, samples_per_task: 8, temperature: 1.0, max_turns: 4,
          max_new_tokens: 96, batch_size: 256, seed: 0}
credit: {method: grpo}
train: {lr: 0.0001, epochs: 1, micro_batch: 16, bf16: true, world_size: $NGPU, seed: 0}
evaluate: {split: heldout, max_tasks: 24, max_turns: 4, max_new_tokens: 96}
curate: {demonstrations: false}
seed: 0
rounds: 2
EOF
(cd "$WORK/project" && printf '__pycache__/\nmlflow.db\nmlruns/\n.rollwise/\n' >.gitignore &&
  git init -q && "$REPO/.venv/bin/dvc" init -q &&
  PYTHONPATH=$WORK/project/src timeout 480 $PY -m flows.run) >"$WORK/pipeline.log" 2>&1 || {
  tail -80 "$WORK/pipeline.log"; echo "device_check: the pipeline failed" >&2; exit 1; }
tail -30 "$WORK/pipeline.log"
cp "$WORK/pipeline.log" "$DEST/pipeline.log"
cp -r "$WORK/project/data/metrics" "$DEST/metrics" 2>/dev/null || true

# 3. The round-01 checkpoint reloads; HF bf16 vs vLLM on it.
log "HF bf16 vs vLLM"
PYTHONPATH=$REPO/src $PY bench/device_agree.py --model "$WORK/project/models/round_01" \
  --suite "$WORK/project/data/envs" --out "$DEST"
log "done: $(ls "$DEST" | xargs)"
rm -rf "$WORK"
