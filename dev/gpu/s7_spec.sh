#!/bin/bash
# Session 7 (issue 31 item 2), from a payload (dev/make_gpu_payload.sh) in a copied checkout: speculative vs plain
# greedy on the trained model, each divergence beyond the token bound replayed decision-aware (cli/spec_divergence.h):
# the GPU test (chain 4, tree 3x4x8) and `eval acceptance` (chain 1, 2, 4 and the tree) with their JSON.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
REPO=$(cd "$P/.." && pwd)
export MXSERVE_REPO_ROOT=$REPO
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
timeout 250 "$B/test_cuda_spec_trained" --gtest_color=no > "$OUT/t_spec_trained.log" 2>&1; echo "test_cuda_spec_trained rc=$?"
grep -E "^\[  FAILED|^\[       OK|^(chain4|tree3x4x8):" "$OUT/t_spec_trained.log" | cut -c1-900
M=$REPO/models/tiny-glm-trained; TXT=$REPO/tests/data/tiny_glm/heldout_sample.txt
run_acc() {  # name, flags...
  local name=$1; shift
  timeout 150 "$B/mxserve" eval acceptance --model "$M" --text "$TXT" --backend cuda "$@" --prompts 8 --prompt-len 128 \
    --gen-tokens 256 --json "$OUT/acc_$name.json" > "$OUT/acc_$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "acceptance length|identical|prompt [0-9]+:" "$OUT/acc_$name.log" | cut -c1-900
}
run_acc chain1 --speculative-num-steps 1
run_acc chain2 --speculative-num-steps 2
run_acc chain4 --speculative-num-steps 4
run_acc tree --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8
t done
