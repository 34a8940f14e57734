#!/bin/bash
# Session 8, last call, part 2: the early-gather sparse prefill and the MoE prefill dequant path's benchmarks, the
# seed layout at 8 layers MXFP4 (512 MiB of KV a rank), then GLM-5.2 8 layers MXFP4 before (the session-7 binary)
# and after: bench-model decode step + prefill chunks (after also with the three fused decode ops off), served
# single stream and 8 streams.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"; B=$P/bin
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
export MXSERVE_FIXTURE_ROOT=${MXSERVE_FIXTURE_ROOT:-$P/fixtures}
t "cascade engine check (the reference's top-2 gap at a divergence)"
timeout 120 "$B/test_cuda_cascade_engine" --gtest_color=no > "$OUT/t_cascade_engine.log" 2>&1; echo "rc=$?"
grep -E "diverge|cascade launches|^\[  (FAILED|PASSED)" "$OUT/t_cascade_engine.log" | head -12
t "sparse prefill bench"; timeout 60 "$B/bench_mla_sparse_prefill" --no-mma > "$OUT/b_sp.log" 2>&1; echo rc=$?; grep -vE "^ceil" "$OUT/b_sp.log" | cut -c1-160 | tail -24
t "moe prefill dequant bench"; timeout 80 "$B/bench_moe_prefill_dequant" > "$OUT/b_mpd.log" 2>&1; echo rc=$?; cut -c1-200 "$OUT/b_mpd.log" | tail -30
t "seed layout"; OUT=$OUT/seed SEED_KV=512MiB timeout 150 bash "$P/gpu/s7_seed.sh" 2>&1 | grep -vE "causal_lm|moe_plan|shared_device_comm|launch_memory" | cut -c1-220 | tail -24
bm() {  # LABEL BIN ENV...
  local label=$1 bin=$2; shift 2
  env "$@" timeout 120 "$B/$bin" bench-model --config "$P/configs/glm52.json" --synthetic-weights --num-layers 8 \
    --quantization mxfp4 --backend cuda --batches 1 --contexts 2048 --prefill 2048,8192 --model-batches 1,8 \
    --md "$OUT/bm_$label.md" > "$OUT/bm_$label.log" 2>&1
  echo "bench-model $label rc=$?"; grep -E "model decode step|^\| (prefill|attention|moe)" "$OUT/bm_$label.log" "$OUT/bm_$label.md" | cut -c1-200 | head -12
}
t "GLM-5.2 bench-model"; bm before mxserve_before; bm after mxserve; bm after_unfused mxserve MXSERVE_FUSED_ADD_NORM=0 MXSERVE_FUSED_PROJ=0 MXSERVE_FUSED_KEY_WRITE=0
for bin in mxserve_before mxserve; do
  t "serve $bin"
  GLM5_BIN="$B/$bin" GLM5_RUNS=nomtp GLM5_C1_REQS=4 GLM5_C8_REQS=16 OUT="$OUT/serve_$bin" \
    timeout 150 bash "$P/gpu/glm5_serve.sh" 2>&1 | grep -E "PASS|FAIL|TPOT|tok/s|summary|c=[18]:" | head -12
done
t done
