#!/bin/bash
# MXFP4 MoE integration on the GPU machine (issue 9, selection half), from a payload made by
# dev/make_gpu_payload.sh (this file lands in its gpu/): one device call runs
#   the MXFP4 integration test (packed experts vs the CPU backend), the missing-table warning on the GLM-4.5-Air
#   expert shape, a short tune-moe of that shape, and the same model with the tuned table (selection log).
set -u
P=$(cd "$(dirname "$0")/.." && pwd); OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT" "$P/lib"
tar -xJf "$P/libs.tar.xz" -C "$P/lib"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
export MXSERVE_FIXTURE_ROOT="$P/fixtures"
nvidia-smi -L
echo "== test_cuda_mxfp4_moe"; timeout 120 "$P/bin/test_cuda_mxfp4_moe" 2>&1 | grep -v "^\[I " | tail -25
echo "== generate, no table"; timeout 150 "$P/bin/mxserve" generate --config "$P/configs/air.json" --synthetic-weights \
  --quantization mxfp4 --num-layers 2 --backend cuda --ids 1,2,3,4,5 --max-tokens 4 --ignore-eos 2>&1 | grep -iE "moe|warn|error|tok/s" | cut -c1-600
mkdir -p "$OUT/tables"
echo "== tune-moe (m 1,8,64,256,2048)"; timeout 200 "$P/bin/mxserve" tune-moe --experts 128 --hidden 4096 --inter 1408 --top-k 8 \
  --dtype mxfp4 --m 1,8,64,256,2048 --out "$OUT/tables/nvidia_h200_E128_H4096_I1408_K8_mxfp4.json" 2>&1 | tail -8
cat "$OUT"/tables/*.json; echo
echo "== generate, --moe-tuning-dir"; timeout 150 "$P/bin/mxserve" generate --config "$P/configs/air.json" --synthetic-weights \
  --quantization mxfp4 --num-layers 2 --backend cuda --ids 1,2,3,4,5 --max-tokens 4 --ignore-eos --moe-tuning-dir "$OUT/tables" 2>&1 | grep -iE "moe|warn|error|tok/s" | cut -c1-600
