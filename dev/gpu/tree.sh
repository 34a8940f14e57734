#!/bin/bash
# MTP tree speculation on the GPU machine (issue 10, tree mode), from a payload made by
# dev/make_gpu_payload.sh (this file lands in its gpu/; dev/gpu/run_all.sh PAYLOAD tree:180 runs it):
#   1. the tree-masked CUDA attention (warp and CUDA-core kernels, "shared" forced must not be used) and
#      the KV compaction op against the CPU reference (test_cuda_ops), the plain attention test too;
#   2. tree greedy equivalence on the CUDA backend (test_cuda_engine: S=3,k=2,M=6 and S=2,k=4,M=8, alone
#      and batched) next to the chain test;
#   3. tree vs chain decode throughput: GLM-4.5-Air config, synthetic weights, 2 layers, simulated
#      acceptance (a tree accepts a path of the simulated length), one `mxserve generate --runs` process.
# Writes $OUT/tree_tests.log, $OUT/tree_runs.log and $OUT/tree_perf.md; prints the summary. ~2-3 minutes.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
export MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
nvidia-smi -L
echo "== test_cuda_ops (tree mask, kv_copy, attention)"
timeout 60 "$P/bin/test_cuda_ops" --gtest_filter='CudaOps.PagedAttentionTreeMask:CudaOps.KvCopyExactInOrder:CudaOps.PagedAttention' \
  > "$OUT/tree_tests.log" 2>&1
echo "rc=$?"; grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) +\]|err +PagedAttentionTree|Failure" "$OUT/tree_tests.log" | head -40
echo "== test_cuda_engine (tree and chain greedy equivalence)"
timeout 60 "$P/bin/test_cuda_engine" --gtest_filter='*TreeSpeculationIsLossless*:*SpeculationIsLosslessOnTheGpu*' \
  >> "$OUT/tree_tests.log" 2>&1
echo "rc=$?"; grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) +\]|tree S=|spec drafted|Failure" "$OUT/tree_tests.log" | tail -20

echo "== tree vs chain throughput (Air config, synthetic, 2 layers, simulated acceptance)"
RUNS="b=1,n=0,p=2000"
for a in 2.0 3.0; do
  RUNS="$RUNS;b=1,n=3,a=$a,adaptive=0,p=2000;b=1,n=3,k=2,m=6,a=$a,adaptive=0,p=2000;b=1,n=3,k=4,m=8,a=$a,adaptive=0,p=2000"
done
for b in 8 32; do
  RUNS="$RUNS;b=$b,n=0,p=512;b=$b,n=3,a=2.5,adaptive=0,p=512;b=$b,n=3,k=2,m=6,a=2.5,adaptive=0,p=512"
  RUNS="$RUNS;b=$b,n=3,k=2,m=6,a=2.5,adaptive=1,p=512"
done
timeout 110 "$P/bin/mxserve" generate --config "$P/configs/air.json" --synthetic-weights --num-layers 2 --backend cuda \
  --ignore-eos --prompt-len 32 --max-tokens 128 --runs "$RUNS" > /dev/null 2> "$OUT/tree_runs.log"
echo "rc=$?"
python3 - "$OUT/tree_runs.log" <<'PY' | tee "$OUT/tree_perf.md"
import json, sys
rows = [json.loads(l.split("RESULT ", 1)[1]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
print("| batch | prompt | mode | N | k | rows/seq | sim A | adaptive | decode tok/s | acc len | vs plain |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
base = {}
for r in rows:
    if r["spec_steps"] == 0: base[(r["batch"], r["prompt_len"])] = r["decode_tok_s"]
for r in rows:
    mode = "plain" if r["spec_steps"] == 0 else ("tree" if r.get("topk", 1) > 1 else "chain")
    b = base.get((r["batch"], r["prompt_len"]))
    gain = "%.2fx" % (r["decode_tok_s"] / b) if b else "-"
    print("| %d | %d | %s | %d | %d | %d | %.1f | %s | %.1f | %.2f | %s |" % (
        r["batch"], r["prompt_len"], mode, r["spec_steps"], r.get("topk", 1), r.get("draft_tokens", 0),
        r["simulate"], r["adaptive"], r["decode_tok_s"], r["acceptance_length"], gain))
PY
grep -iE "error|abort|check failed" "$OUT/tree_runs.log" | head -5
