#!/bin/bash
# Session 9, first H100 call: every merged change's GPU oracle in one call. Phase 1 runs four lanes of
# correctness tests at once on the one GPU (tiny fixtures, launch-bound; no timing asserted); phase 2 runs what is
# sensitive to other processes (device-memory sizing, timings) alone. Lanes: s9_tests.sh lists (bin:seconds[:filter]).
set -u
. "$(dirname "$0")/payload_env.sh"
S=$(dirname "$0")
lane() { local name=$1; shift; mkdir -p "$OUT/$name"; S9_TESTS="$*" OUT="$OUT/$name" timeout ${LANE_SECS:-300} bash "$S/s9_tests.sh" > "$OUT/$name/lane.log" 2>&1; echo "lane $name rc=$?" >> "$OUT/$name/lane.log"; }
t "phase 1"
lane graphs "test_cuda_graphs:150 test_cuda_graph_sampling:150 test_cuda_cascade_engine:200" &
lane attn "test_cuda_kv_fp8:120:*Attention* test_cuda_cascade_attention:120 test_cuda_ops:200 test_cuda_skinny_gemm:60" &
lane moe "test_cuda_moe_mxfp4:120 test_cuda_moe_mxfp4_wg:90 test_cuda_moe_mxfp4_wg8:90 test_cuda_moe_mxfp4_pd:90 test_cuda_moe_prefill_dequant:90 test_cuda_mla_fp8:90 test_cuda_mla_dsa:120" &
lane par "test_cuda_rank_graphs:150 test_cuda_parallel_layouts:290:*CudaGraphsUnderDpMatchEager*:*CudaGraphsAtTpAboveOne*" &
wait
for l in graphs attn moe par; do cat "$OUT/$l/lane.log"; done
t "phase 2"
S9_TESTS="test_cuda_lockstep_recovery:150 test_engine_oom_cuda:90" OUT="$OUT/mem" bash "$S/s9_tests.sh" 2>&1 | tee "$OUT/mem.log"
t "bench_cascade_attention"
timeout 80 "$B/bench_cascade_attention" --sweep --fp8-loads both > "$OUT/bench_cascade.log" 2>&1; echo "rc=$?" >> "$OUT/bench_cascade.log"
cut -c1-200 "$OUT/bench_cascade.log" | tail -30
t "bench-model decode row"
bash "$S/s9_bm.sh" 2>&1 | tail -40
t done
