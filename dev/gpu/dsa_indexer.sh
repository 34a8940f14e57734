#!/bin/bash
# Issue 36 item 4 on the GPU machine, from a payload folder made by dev/make_gpu_payload.sh: the fused DSA indexer
# (IndexerScoreKernel::kFused / kFusedSplit, bf16 and FP8 keys) against the CPU oracle and kMma
# (test_cuda_mla_dsa *IndexerTopk*: "[ fused ]", "[ split ]", "[ ring ]" lines per case, PASS/FAIL, the graph
# replays; test_cuda_mla_fp8 IndexerFusedFp8EqualsMma: "[ indexer ] FP8 fused" lines), then bench_dsa_indexer
# (fused / fused-split / split-ring3 / split-ring4 / mma, bf16 and FP8 keys, eager and in a CUDA graph, us and
# fraction of copy bandwidth at batch 1 / 16 / 64 x 2k / 20k / 64k keys, the two targets MET/MISSED)
# -> $OUT/dsa_indexer_test.log, $OUT/dsa_indexer_fp8_test.log, $OUT/dsa_indexer_bench.log.
#   usage: dsa_indexer.sh [--quick]        (OUT defaults to /tmp/mxserve_gpu)
set -u
. "$(dirname "$0")/payload_env.sh"
timeout 400 "$P/bin/test_cuda_mla_dsa" --gtest_color=no --gtest_filter='*IndexerTopk*' \
  > "$OUT/dsa_indexer_test.log" 2>&1
echo "test rc=$? (124 = timeout)"
grep -E "^\[ (topk|fused|split|ring) |^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure" "$OUT/dsa_indexer_test.log"
timeout 300 "$P/bin/test_cuda_mla_fp8" --gtest_color=no --gtest_filter='CudaMlaFp8.Indexer*' \
  > "$OUT/dsa_indexer_fp8_test.log" 2>&1
echo "fp8 test rc=$? (124 = timeout)"
grep -E "^\[ indexer |^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure" "$OUT/dsa_indexer_fp8_test.log"
timeout 500 "$P/bin/bench_dsa_indexer" "$@" 2>&1 | tee "$OUT/dsa_indexer_bench.log"
