#!/bin/bash
# Run by the payload of make_serve_payload.sh on the GPU machine: does --max-itl-ms keep ITL bounded while
# long prompts prefill next to running decodes? Serves the GLM-4.5-Air geometry (synthetic MXFP4 experts,
# LAYERS layers) twice -- ITL target on (MAX_ITL_MS, default 50) and off (0) -- with large hard caps
# (8192), and runs the same seed-like load against each (shared prefix, 20k in / 300 out, 60% cached,
# constant arrivals). Prints bench's TTFT / ITL table and the fitted step cost model from /metrics.
#   bash out/gpu_serve/run_itl.sh     (LAYERS=46 for the whole model; RATE, NUM, MAX_ITL_MS to change the load)
set -u
P=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mxserve_gpu_itl}
mkdir -p "$OUT" "$P/lib"
tar -xJf "$P/libs.tar.xz" -C "$P/lib"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
CUDART_PIP=$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.dirname(nvidia.cuda_runtime.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${CUBLAS_PIP}:${CUDART_PIP}:${LD_LIBRARY_PATH:-}"
LAYERS=${LAYERS:-8}
RATE=${RATE:-0.3}
NUM=${NUM:-16}
for ITL in ${MAX_ITL_MS:-50} 0; do
  "$P/bin/mxserve" serve --config "$P/models/GLM-4.5-Air/config.json" --synthetic-weights --quantization mxfp4 \
    --num-layers "$LAYERS" --backend cuda --tokenizer "$P/tokenizer" --port 8000 --served-model-name glm-4.5-air \
    --kv-cache-memory 40GiB --max-model-len 32768 --max-num-batched-tokens 8192 --chunked-prefill-size 8192 \
    --max-itl-ms "$ITL" --stats-interval 10 > "$OUT/serve_itl$ITL.log" 2>&1 &
  PID=$!
  for i in $(seq 1 600); do
    curl -s localhost:8000/health | grep -q ok && break
    kill -0 $PID 2>/dev/null || break
    sleep 1
  done
  echo "=== --max-itl-ms $ITL (ready after ${i}s)"
  "$P/bin/mxserve" bench --base-url http://127.0.0.1:8000 --model glm-4.5-air --tokenizer "$P/tokenizer" \
    --endpoint completions --workload shared-prefix --input-len 20000 --output-len 300 --cache-hit-rate 0.6 \
    --num-prefix-groups 2 --arrival constant --request-rate "$RATE" --num-requests "$NUM" --warmup-requests 2 \
    --no-progress --output-json "$OUT/bench_itl$ITL.json" 2>&1 | tail -25
  curl -s localhost:8000/metrics | grep -E '^mxserve:(itl_|step_cost|step_seconds)|^vllm:(num_preemptions|inter_token_latency_seconds_(sum|count))'
  grep -E "step cost model|out of reach" "$OUT/serve_itl$ITL.log" | tail -3
  kill -TERM $PID
  wait $PID
done
