#!/bin/bash
# Issue 23 item 11: checkpoints mxserve did not write, from the committed fixtures: transformers' own FP8
# quantization op (<fx>_fp8_hf, MTP layer included), transformers' from_pretrained + save_pretrained
# (<fx>_fp8_hf_saved) and an independent Quark-layout MXFP4 writer (<fx>_mxfp4_quark); packed to
# $OUT/independent_ckpt.tar.gz (tests/data/independent_ckpt/README.md).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
SRC=$(cd "$P/.." && pwd)   # the checkout (the payload sits in it)
T=$(mktemp -d)
(cd "$SRC" && python3 tools/independent_ckpt/make_all.py --fixtures tests/fixtures --out "$T/independent_ckpt")
rc=$?
tar -czf "$OUT/independent_ckpt.tar.gz" -C "$T" independent_ckpt
find "$T/independent_ckpt" -maxdepth 2 | head -40; cat "$T"/independent_ckpt/*/LAYOUT.txt 2>/dev/null | head -40
exit $rc
