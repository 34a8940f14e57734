#!/bin/bash
# MTP speculative decoding performance table (issue 10) on one GPU, GLM-4.5-Air config with synthetic
# weights truncated to 2 layers (bf16 Air does not fit one GPU) plus its MTP layer. Run from a payload
# folder made by dev/make_gpu_payload.sh (it lands there as spec_perf.sh). Writes $OUT/spec_perf.md and the
# raw logs; every measurement is a `RESULT {json}` line of `mxserve generate --runs`.
#   1. single stream, 10k-token prompt: decode tok/s without speculation and with N = 1, 2, 3 (fixed) at
#      simulated acceptance lengths 1.5, 2.0, 2.5, 3.0 (where A <= N + 1);
#   2. aggregate decode tok/s at batch 8, 32, 64 (1k-token prompts): no speculation, N = 3 fixed, N = 3
#      with the adaptive policy (simulated acceptance 2.0);
#   3. both again with --quantization mxfp4 (MXFP4 routed experts) if that works on CUDA.
# The roofline column is bytes touched per step / the device copy bandwidth measured in this run by
# `mxserve bench-model` (src/kernels/cuda/ceilings.h: 2 GiB device-to-device copy), per
# /work/shared/research/anchors-perf.md 5d; one roofline per model configuration.
#   usage: spec_perf.sh [--no-mxfp4]
# Dry run of the plumbing on a CPU (tiny sizes): SPEC_PERF_BACKEND=cpu SPEC_PERF_CONFIG=tiny.json
#   SPEC_PERF_SINGLE_PROMPT=64 SPEC_PERF_BATCH_PROMPT=32 SPEC_PERF_TOKENS=16 SPEC_PERF_BATCHES="2 4" spec_perf.sh --no-mxfp4
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}  # the payload folder (this script sits in its gpu/)
OUT=${OUT:-/tmp/mxserve_gpu}
mkdir -p "$OUT" "$P/lib"
MXFP4=1
for a in "$@"; do case $a in --no-mxfp4) MXFP4=0 ;; esac; done
[ -d "$P/lib" ] && [ -z "$(ls -A "$P/lib")" ] && tar -xJf "$P/libs.tar.xz" -C "$P/lib"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
MX="$P/bin/mxserve"
BACKEND=${SPEC_PERF_BACKEND:-cuda}
CONFIG=${SPEC_PERF_CONFIG:-$P/configs/air.json}
SP=${SPEC_PERF_SINGLE_PROMPT:-10000}
BP=${SPEC_PERF_BATCH_PROMPT:-1024}
TOKENS=${SPEC_PERF_TOKENS:-256}
BATCHES=${SPEC_PERF_BATCHES:-8 32 64}
COMMON=(--config "$CONFIG" --synthetic-weights --backend "$BACKEND" --ignore-eos --prompt-len 32)
FULL_TOKENS=${SPEC_PERF_FULL_TOKENS:-128}
# The copy-bandwidth ceiling, measured now on this GPU (bench-model prints "ceilings: copy N GB/s").
COPY_GBS=$("$MX" bench-model --config "$CONFIG" --synthetic-weights --backend "$BACKEND" --num-layers 1 --batches 1 \
  --contexts 128 --prefill 128 --model-batches 1 2>&1 | sed -n 's/^ceilings: copy \([0-9.]*\) GB\/s.*/\1/p' | head -1)
if [ -z "$COPY_GBS" ]; then
  echo "spec_perf.sh: no measured copy bandwidth (bench-model printed no 'ceilings:' line; CPU backend?):" \
       "rooflines are left out" >&2
  COPY_GBS=0
fi
export COPY_GBS
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; cat "$P/commit.txt"; } > "$OUT/spec_perf_env.txt" 2>&1

SINGLE="b=1,n=0,p=$SP"
for n in 1 2 3; do
  for a in 1.5 2.0 2.5 3.0; do
    awk -v a=$a -v n=$n 'BEGIN{exit !(a <= n + 1)}' && SINGLE="$SINGLE;b=1,n=$n,a=$a,adaptive=0,p=$SP"
  done
done
BATCH=""
for b in $BATCHES; do
  BATCH="$BATCH;b=$b,n=0,p=$BP;b=$b,n=3,a=2.0,adaptive=0,p=$BP;b=$b,n=3,a=2.0,adaptive=1,p=$BP"
done

run() {  # label, seconds, tokens, extra flags...: one process per model (the synthetic weights load once)
  local label=$1 limit=$2 tokens=$3; shift 3
  timeout "$limit" "$MX" generate "${COMMON[@]}" "$@" --max-tokens "$tokens" --runs "$SINGLE$BATCH" > /dev/null \
    2> "$OUT/spec_runs_$label.log"
  echo "runs $label rc=$?" >> "$OUT/spec_perf_env.txt"
}
run bf16 110 "$TOKENS" --num-layers 2
# The whole GLM-4.5-Air (46 layers + MTP) fits one H200 with MXFP4 routed experts (~68 GB).
[ $MXFP4 = 1 ] && run mxfp4_full 240 "$FULL_TOKENS" --quantization mxfp4

export SPEC_PERF_CONFIG="${SPEC_PERF_CONFIG:-GLM-4.5-Air config}" SPEC_PERF_BACKEND=$BACKEND
python3 - "$OUT" "$P/configs/air.json" <<'PY' > "$OUT/spec_perf.md"
import json, os, sys
out, cfgp = sys.argv[1], sys.argv[2]
c = json.load(open(cfgp))
H, V, E, K = c["hidden_size"], c["vocab_size"], c["n_routed_experts"], c["num_experts_per_tok"]
q = c["num_attention_heads"] * c["head_dim"]; kv = c["num_key_value_heads"] * c["head_dim"]
BW = float(os.environ.get("COPY_GBS", "0")) * 1e9  # measured in this run; 0: no rooflines
attn = 2 * H * q + 2 * H * kv
dense = 3 * H * c["intermediate_size"]
expert = 3 * H * c["moe_intermediate_size"]
head = V * H
kv_tok = 2 * kv * 2  # K and V, bf16, per layer per token
def U(t): return E * (1 - (1 - K / E) ** t)
def model_bytes(fmt, moe_layers=1):
    eb = 0.53125 if fmt.startswith("mxfp4") else 2.0
    # Layer 0 dense, then MoE layers (shared + routed), MTP layer MoE + eh_proj + its own shared head.
    def target(t, B, C):
        return (2 * ((1 + moe_layers) * attn + dense + moe_layers * (expert + E * H) + head)
                + moe_layers * U(t) * expert * eb + B * C * (1 + moe_layers) * kv_tok)
    def mtp(t, B, C): return 2 * (2 * H * H + attn + expert + E * H + head) + U(t) * expert * eb + B * C * kv_tok
    return target, mtp
def roofline(fmt, B, C, n, A, spec=True, moe_layers=1):
    target, mtp = model_bytes(fmt, moe_layers)
    if not spec: b = target(B, B, C)
    elif n == 0: b = target(B, B, C) + mtp(B, B, C) - 2 * head  # paused: the extend skips the MTP head
    else: b = target(B * (n + 1), B, C) + mtp(B * A, B, C) + (n - 1) * mtp(B, B, C)
    return (B * A / (b / BW) if BW > 0 else float("nan")), b
def results(path):
    r = []
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("RESULT "): r.append(json.loads(line[7:]))
    return r
print(f"# MTP speculative decoding, {os.environ.get('SPEC_PERF_CONFIG', 'GLM-4.5-Air config')}, synthetic weights, "
      f"backend {os.environ.get('SPEC_PERF_BACKEND', 'cuda')}: bf16 truncated to 2 layers + MTP, and the whole model "
      f"(46 layers + MTP) with MXFP4 routed experts\n")
print(open(os.path.join(out, "spec_perf_env.txt")).read().replace("\n", "  \n"))
print("Decode-only tok/s: from the moment every sequence has its first token to the end (prefill excluded). "
      "SIMULATED ACCEPTANCE in every speculative row (`--speculative-simulate-acceptance A`: floor(A - 1 + u) drafts "
      "accepted per step; all draft and verify work is real, the acceptance is not the model's). Roofline: bytes per "
      f"step (weights touched with independent-routing expert union U(t), KV read) / the copy bandwidth measured in "
      f"this run ({BW / 1e9:.0f} GB/s), times tokens per step; one roofline per model configuration.\n")
for fmt, ml, title in (("bf16", 1, "bf16, 2 layers + MTP"), ("mxfp4_full", 45, "MXFP4 routed experts, all 46 layers + MTP")):
    runs = results(f"{out}/spec_runs_{fmt}.log")
    single, batch = [r for r in runs if r["batch"] == 1], [r for r in runs if r["batch"] > 1]
    if not runs:
        print(f"## {fmt}: no results (see spec_runs_{fmt}.log)\n"); continue
    print(f"## {title}\n\n### Single stream, {single[0]['prompt_len'] if single else '?'}-token prompt\n")
    print("Simulated acceptance (benchmark mode) in every N > 0 row.\n")
    print("| N | simulated A | measured A | decode-only tok/s | speedup | roofline tok/s | GB/step |\n|---|---|---|---|---|---|---|")
    base = next((r["decode_tok_s"] for r in single if r["spec_steps"] == 0), None)
    for r in single:
        n, A = r["spec_steps"], r["acceptance_length"]
        rl, b = roofline(fmt, 1, r["prompt_len"], n, A, spec=n > 0, moe_layers=ml)
        sp = f"{r['decode_tok_s'] / base:.2f}x" if base else "-"
        print(f"| {n or 'off'} | {r['simulate'] or '-'} | {A:.2f} | {r['decode_tok_s']:.1f} | {sp} | {rl:.0f} | {b / 1e9:.2f} |")
    print(f"\n### Aggregate decode-only throughput, {batch[0]['prompt_len'] if batch else '?'}-token prompts, simulated acceptance A = 2.0\n")
    print("Simulated acceptance (benchmark mode) in every speculative row.\n")
    print("| batch | mode | mean N per verify | measured A | decode-only tok/s | vs off | policy est. gain | roofline tok/s |\n|---|---|---|---|---|---|---|---|")
    offs = {r["batch"]: r["decode_tok_s"] for r in batch if r["spec_steps"] == 0}
    for r in batch:
        B, n = r["batch"], r["spec_steps"]
        mode = "off" if n == 0 else ("N=3 adaptive" if r["adaptive"] else "N=3 fixed")
        rl, _ = roofline(fmt, B, r["prompt_len"], r.get("mean_n", r["final_n"]) if n else 0, r["acceptance_length"], spec=n > 0, moe_layers=ml)
        vs = f"{r['decode_tok_s'] / offs[B]:.2f}x" if offs.get(B) else "-"
        print(f"| {B} | {mode} | {r.get('mean_n', r['final_n']) if n else '-'} | {r['acceptance_length']:.2f} | {r['decode_tok_s']:.1f} | {vs} | "
              f"{r['estimated_gain']:.2f} | {rl:.0f} |")
    print()
PY
cat "$OUT/spec_perf.md"
