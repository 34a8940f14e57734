#!/bin/bash
# Session 6 (issue 31 items 1-2), from a payload (dev/make_gpu_payload.sh) in a checkout copied to the GPU machine:
# phase 1: the decision-aware fixture checks on CUDA (every path forced, judged by the bf16 format bound),
#          speculative vs plain greedy on the trained model (chain 4, tree 3x4x8: divergences judged at their first
#          differing token), the engine and CUDA-graph tests;
# phase 2: `mxserve verify-fixture --backend cuda` on every fixture (the per-path lines and summaries), and
#          `eval acceptance` on the trained model (chain 1..4 and the tree) with each divergence's margin and bound.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
REPO=$(cd "$P/.." && pwd)
export MXSERVE_REPO_ROOT=$REPO
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
t "phase 1: tests"
for tst in test_cuda_fixture test_cuda_spec_trained test_cuda_engine test_cuda_graphs; do
  ( [ -x "$B/$tst" ] || { echo "$tst: not in payload" >> "$OUT/tests_rc.txt"; exit 0; }
    timeout 280 "$B/$tst" > "$OUT/t_$tst.log" 2>&1; echo "$tst rc=$?" >> "$OUT/tests_rc.txt" ) &
done
wait
t "phase 1 done"; cat "$OUT/tests_rc.txt"
for f in "$OUT"/t_*.log; do echo "== $(basename $f)"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$f" | head -8; done
grep -hE "^(chain4|tree3x4x8):" "$OUT/t_test_cuda_spec_trained.log" | cut -c1-260
grep -hE "decisions, every path|BEYOND|legitimate flip" "$OUT/t_test_cuda_fixture.log" | cut -c1-260 | head -40
t "phase 2: verify-fixture and eval acceptance"
for fx in "$P"/fixtures/*/; do
  echo "== verify-fixture $(basename $fx)"
  timeout 120 "$B/mxserve" verify-fixture "$fx" --backend cuda --max-rel-l2 2e-2 > "$OUT/vf_$(basename $fx).log" 2>&1
  echo "rc=$?"; grep -E "decisions, every path|failed checks|BEYOND" "$OUT/vf_$(basename $fx).log" | cut -c1-240
done
M=$REPO/models/tiny-glm-trained; TXT=$REPO/tests/data/tiny_glm/heldout_sample.txt
for n in 1 2 4; do
  timeout 120 "$B/mxserve" eval acceptance --model "$M" --text "$TXT" --backend cuda --speculative-num-steps $n \
    --prompts 8 --prompt-len 128 --gen-tokens 256 --json "$OUT/acc_chain_$n.json" > "$OUT/acc_chain_$n.log" 2>&1
  echo "== chain $n rc=$?"; grep -E "acceptance length|identical|prompt [0-9]+:" "$OUT/acc_chain_$n.log" | cut -c1-260
done
timeout 120 "$B/mxserve" eval acceptance --model "$M" --text "$TXT" --backend cuda --speculative-num-steps 3 \
  --speculative-eagle-topk 4 --speculative-num-draft-tokens 8 --prompts 8 --prompt-len 128 --gen-tokens 256 \
  --json "$OUT/acc_tree.json" > "$OUT/acc_tree.log" 2>&1
echo "== tree rc=$?"; grep -E "acceptance length|identical|prompt [0-9]+:" "$OUT/acc_tree.log" | cut -c1-260
t done
