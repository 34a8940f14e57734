#!/bin/bash
# Issue 16: the glm_moe_dsa fixtures made by transformers 5.17 on the GPU machine (tools/make_glm_moe_dsa_fixture.py),
# packed to $OUT/dsa_fixtures.tar.gz for tests/fixtures/. Uses the machine's python (torch + transformers), not the payload.
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
SRC=$(cd "$P/.." && pwd)
T=$(mktemp -d)
cd "$SRC"
for v in a b; do
  LD_LIBRARY_PATH= timeout 45 python3 tools/make_glm_moe_dsa_fixture.py --variant $v --out "$T/glm_moe_dsa_tiny_$v" \
    > "$T/glm_moe_dsa_$v.log" 2>&1
  echo "variant $v rc=$?"; grep -E "^case|rc|Error|error" "$T/glm_moe_dsa_$v.log" | tail -8
done
tar -czf "$OUT/dsa_fixtures.tar.gz" -C "$T" .
