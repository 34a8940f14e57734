#!/bin/bash
# Run by the payload of make_serve_payload.sh on the GPU machine -- mxserve serve on the GPU: GLM-4.5-Air config, synthetic weights (first 2 layers: 1 dense + 1 MoE with
# 128 experts), CUDA backend, the Qwen3 tokenizer; requests over HTTP; graceful SIGTERM.
set -u
P=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mxserve_gpu_serve}
mkdir -p "$OUT" "$P/lib"
tar -xJf "$P/libs.tar.xz" -C "$P/lib"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
CUDART_PIP=$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.dirname(nvidia.cuda_runtime.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${CUBLAS_PIP}:${CUDART_PIP}:${LD_LIBRARY_PATH:-}"
ldd "$P/bin/mxserve" | grep -E "not found|cublas|cudart" | tee "$OUT/ldd.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
LAYERS=${LAYERS:-2}
"$P/bin/mxserve" serve --config "$P/models/GLM-4.5-Air/config.json" --synthetic-weights --num-layers $LAYERS \
  --backend cuda --tokenizer "$P/tokenizer" --port 8000 --served-model-name glm-4.5-air \
  --kv-cache-memory 16GiB --max-model-len 8192 --stats-interval 5 > "$OUT/serve.log" 2>&1 &
PID=$!
for i in $(seq 1 400); do
  curl -s localhost:8000/health | grep -q ok && break
  kill -0 $PID 2>/dev/null || break
  sleep 1
done
echo "ready after ${i}s" | tee "$OUT/client.txt"
{
  echo '--- GET /v1/models'; curl -s localhost:8000/v1/models; echo
  echo '--- POST /v1/chat/completions'
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"glm-4.5-air","messages":[{"role":"user","content":"Hello! Who are you?"}],"max_tokens":32,"ignore_eos":true}'; echo
  echo '--- POST /v1/completions (stream, usage)'
  curl -sN localhost:8000/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt":"The capital of France is","max_tokens":6,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true}'
  echo '--- 32 concurrent streams x 64 tokens'
  T0=$(date +%s.%N)
  PIDS=()
  for k in $(seq 1 32); do
    curl -sN localhost:8000/v1/completions -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"Request $k: tell me a story\",\"max_tokens\":64,\"stream\":true,\"ignore_eos\":true}" | grep -c '^data: {' > "$OUT/c$k.txt" &
    PIDS+=($!)
  done
  wait "${PIDS[@]}"
  T1=$(date +%s.%N)
  echo "chunks per client: $(cat "$OUT"/c*.txt | sort | uniq -c | tr '\n' ' ')  wall $(awk -v a=$T0 -v b=$T1 'BEGIN{printf "%.2f", b-a}') s"
  echo '--- metrics excerpt'
  curl -s localhost:8000/metrics | grep -E '^vllm:(num_requests|kv_cache|generation_tokens|prompt_tokens|request_success|time_to_first_token_seconds_(sum|count)|e2e_request_latency_seconds_(sum|count)|inter_token_latency_seconds_(sum|count))'
} >> "$OUT/client.txt" 2>&1
kill -TERM $PID
wait $PID
echo "serve exit code $?" >> "$OUT/client.txt"
cat "$OUT/client.txt"
echo '--- serve.log'
cat "$OUT/serve.log"
