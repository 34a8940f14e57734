#!/bin/bash
# Multi-node on CUDA (issue 32 item 5), NEEDS TWO GPUs (the nvidia-h100-x2 kind): two mxserve processes on one
# host, each a "node" with one GPU (CUDA_VISIBLE_DEVICES 0 / 1), NCCL over the rendezvous on 127.0.0.1.
#  1. `generate` on node 0 + `serve --node-rank 1` at tp 2 on glm4_moe_tiny_a / _b: greedy ids == one GPU's;
#  2. a served request through node 0, then SIGTERM: both exit 0;
#  3. the follower killed mid-serve: node 0 exits 1 naming node 1 (no hang).
# NCCL will not put two ranks of one communicator on one device, so this cannot run on one GPU.
# Run from a checkout with a CUDA build (the device tool copies the tree; carry build/): OUT=$OUT bash dev/gpu/multinode_cuda.sh
# (MX=path/to/mxserve overrides the binary; LIBDIR=dir with extra shared libraries, e.g. an unpacked libs.tar.xz).
set -u
P=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
MX=${MX:-$P/build/mxserve}
FX=$P/tests/fixtures
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
NCCL_PIP=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="${LIBDIR:-$P/lib}:/usr/local/cuda/lib64:${CUBLAS_PIP}:${NCCL_PIP}:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
RC=0
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "FAIL: needs 2 GPUs (nvidia-smi -L: $(nvidia-smi -L | wc -l))"; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for f in glm4_moe_tiny_a glm4_moe_tiny_b; do
  IDS="--ids 1,2,3,4,5,6,7 --max-tokens 8 --ignore-eos"
  one=$(CUDA_VISIBLE_DEVICES=0 timeout 120 "$MX" generate --model "$FX/$f" --backend cuda $IDS 2> "$OUT/mn_one_$f.log" | tail -n 1)
  A="--backend cuda --tp-size 2 --nnodes 2 --dist-init-addr 127.0.0.1:$(port) --dist-timeout 120"
  CUDA_VISIBLE_DEVICES=1 timeout 180 "$MX" serve --model "$FX/$f" $A --node-rank 1 > "$OUT/mn_f_$f.log" 2>&1 & F=$!
  two=$(CUDA_VISIBLE_DEVICES=0 timeout 180 "$MX" generate --model "$FX/$f" $IDS $A --node-rank 0 2> "$OUT/mn_l_$f.log" | tail -n 1)
  wait $F; frc=$?
  if [ -n "$one" ] && [ "$one" = "$two" ] && [ $frc = 0 ]; then echo "PASS $f: tp 2 over 2 nodes == one GPU ($two)"
  else echo "FAIL $f: one GPU '$one', two nodes '$two', follower rc $frc"; tail -n 5 "$OUT/mn_l_$f.log" "$OUT/mn_f_$f.log"; RC=1; fi
done
# 2 + 3: serve through node 0 (models/tiny-glm-trained: real weights, its tokenizer), then kill the follower.
M=$P/models/tiny-glm-trained; HP=$(port)
A="--backend cuda --tp-size 2 --nnodes 2 --dist-init-addr 127.0.0.1:$(port) --dist-timeout 120"
CUDA_VISIBLE_DEVICES=1 "$MX" serve --model "$M" $A --node-rank 1 > "$OUT/mn_serve_f.log" 2>&1 & F=$!
CUDA_VISIBLE_DEVICES=0 "$MX" serve --model "$M" $A --node-rank 0 --port $HP \
  --kv-cache-memory 256MiB --stats-interval 0 > "$OUT/mn_serve_l.log" 2>&1 & L=$!
for i in $(seq 240); do curl -sf "127.0.0.1:$HP/health" > /dev/null && break; sleep 0.5; done
body=$(curl -s "127.0.0.1:$HP/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}')
if grep -q '"completion_tokens":8' <<<"$body"; then echo "PASS: served over 2 nodes: $body"
else echo "FAIL: served request: $body"; tail -n 5 "$OUT/mn_serve_l.log" "$OUT/mn_serve_f.log"; RC=1; fi
kill -KILL $F; wait $F 2>/dev/null
for i in $(seq 20); do kill -0 $L 2>/dev/null || break; sleep 0.5; done
if kill -0 $L 2>/dev/null; then echo "FAIL: node 0 still running 10 s after node 1 died"; kill -KILL $L; RC=1
else wait $L; lrc=$?
  if [ $lrc = 1 ] && grep -q "node 1 (ranks 1..1) stopped" "$OUT/mn_serve_l.log"; then echo "PASS: node 1 killed -> node 0 exit 1, named"
  else echo "FAIL: node 0 rc $lrc"; tail -n 5 "$OUT/mn_serve_l.log"; RC=1; fi
fi
exit $RC
