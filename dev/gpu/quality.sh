#!/bin/bash
# Issue 22: the tiny trained GLM's quality and MTP-acceptance tables on the H200
# (tools/train_tiny_glm/quality_tables.sh with the payload's mxserve); the markdown lands in $OUT.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
SRC=$(cd "$P/.." && pwd)
W="$P/mxserve_wrapped"
printf '#!/bin/sh\nexec "%s/bin/mxserve" "$@"\n' "$P" > "$W"; chmod +x "$W"   # LD_LIBRARY_PATH is run_all.sh's
export MXSERVE_COMMIT=$(awk '/^commit/{print substr($2,1,7)}' "$P/commit.txt")
bash "$SRC/tools/train_tiny_glm/quality_tables.sh" "$W" "$OUT/tiny-glm-trained.md"
