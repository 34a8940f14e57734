#!/usr/bin/env bash
# The one GPU-machine call of issue 22: a smoke run of the whole path (tiny steps, into a temp dir; aborts the
# call on any error), then the real run into $OUT. Needs tools/train_tiny_glm/data (carried: it is git-ignored).
#   bash tools/train_tiny_glm/run_gpu.sh [TIME_BUDGET_S]      (default 330 s of training)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the output folder}
BUDGET=${1:-330}
mkdir -p "$OUT"
SMOKE=$(mktemp -d)
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "=== smoke ==="
  rc=0
  python3 -u tools/train_tiny_glm/train.py --data tools/train_tiny_glm/data --out "$SMOKE" --smoke || rc=$?
  if [ "$rc" = 3 ]; then
    echo "SMOKE: the transformers stage failed (above); training anyway: the checkpoint is saved before that stage"
  elif [ "$rc" != 0 ]; then
    echo "SMOKE FAILED (exit $rc): not training"; exit "$rc"
  fi
  echo "=== train (budget ${BUDGET} s) ==="
  python3 -u tools/train_tiny_glm/train.py --data tools/train_tiny_glm/data --out "$OUT" --time-budget "$BUDGET"
} 2>&1 | tee "$OUT/train.log"
