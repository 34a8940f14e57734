#!/bin/bash
# Structured output: the per-step token-mask cost at batch 64 over the real 151,936-token Qwen3 vocabulary
# (mxserve bench-grammar; CPU work on the GPU machine's host). Needs the tokenizer in $P/tok. Run by run_all.sh.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
nproc; lscpu | grep -E "Model name|^CPU\(s\)" || true
for b in 1 64; do
  mkdir -p "$P/tok" && tar -xJf "$P/tok.tar.xz" -C "$P/tok"
  timeout 120 "$P/bin/mxserve" bench-grammar --tokenizer "$P/tok" --batch $b --steps 200 --vocab-size 151936 2>&1 | tee "$OUT/bench_grammar_b$b.log"
done
