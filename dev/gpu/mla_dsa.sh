#!/bin/bash
# Issue 16, CUDA: the MLA + DSA ops against the CPU reference (test_cuda_mla_dsa), the glm_moe_dsa fixtures
# on CUDA (test_cuda_fixture + verify-fixture --backend cuda), a short greedy generate on CUDA and CPU (same
# ids expected unless a logged bf16 flip), GLM-5.2 shapes end to end (synthetic, 4 layers) and the op tests under
# compute-sanitizer memcheck when present.
# Run by run_all.sh (needs its LD_LIBRARY_PATH and MXSERVE_FIXTURE_ROOT).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
RC=0
MXSERVE_CUDA_SYNC=1 timeout 180 "$P/bin/test_cuda_mla_dsa" --gtest_color=no > "$OUT/mla_dsa_ops.log" 2>&1 || RC=$?
echo "test_cuda_mla_dsa rc=$RC"
grep -E "^\[ (err|exact|topk)|^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure" "$OUT/mla_dsa_ops.log" | head -60
timeout 150 "$P/bin/test_cuda_fixture" --gtest_color=no --gtest_filter='*glm_moe_dsa*' > "$OUT/mla_dsa_fixture.log" 2>&1
rc=$?; echo "test_cuda_fixture (glm_moe_dsa) rc=$rc"; [ $rc = 0 ] || RC=$rc
grep -E "^\[  (     OK|FAILED|  PASSED|  SKIPPED) \]|Failure|greedy rows|flip|rel|error" "$OUT/mla_dsa_fixture.log" | head -40
for v in a b; do
  f="$P/fixtures/glm_moe_dsa_tiny_$v"
  timeout 60 "$P/bin/mxserve" verify-fixture "$f" --backend cuda --max-rel-l2 2e-2 > "$OUT/mla_dsa_verify_$v.log" 2>&1
  rc=$?; echo "verify-fixture glm_moe_dsa_tiny_$v --backend cuda rc=$rc"; [ $rc = 0 ] || RC=$rc
  tail -15 "$OUT/mla_dsa_verify_$v.log"
  for be in cuda cpu; do
    echo "generate $v $be: $(timeout 60 "$P/bin/mxserve" generate --model "$f" --backend $be --ids 1,2,3,4,5,6,7,8,9 \
      --max-tokens 24 --ignore-eos 2>&1 | tail -3 | tr '\n' ' ')"
  done
done
# GLM-5.2 shapes end to end (synthetic weights, 4 layers, MXFP4 experts): 64 heads, kv_lora 512, indexer 32 x 128,
# index_topk 2048 below a 3000-token prompt, so prefill and decode both take the sparse path. Throughput only.
for b in 1 4; do
  timeout 150 "$P/bin/mxserve" generate --config "$P/configs/glm52.json" --synthetic-weights --num-layers 4 \
    --quantization mxfp4 --backend cuda --prompt-len 3000 --batch $b --max-tokens 32 --ignore-eos \
    > "$OUT/mla_dsa_glm52_b$b.log" 2>&1
  rc=$?; echo "GLM-5.2 synthetic 4 layers, prompt 3000, batch $b: rc=$rc"; [ $rc = 0 ] || RC=$rc
  grep -vE "^\[I " "$OUT/mla_dsa_glm52_b$b.log" | tail -4
done
if command -v compute-sanitizer > /dev/null; then
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 "$P/bin/test_cuda_mla_dsa" --gtest_color=no \
    --gtest_filter='*LayerNorm*:*Rope*:*CopyColumns*:*IndexerTopk*:*MlaAttention*' > "$OUT/mla_dsa_memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/mla_dsa_memcheck.log" | tail -1)"
fi
exit $RC
