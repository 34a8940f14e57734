#!/bin/bash
# Issue 32 item 1: the shared-device communicator (N ranks on ONE GPU, a test / benchmark stand-in), on one GPU
# (standalone from a payload folder, like nccl.sh):
#  1. test_cuda_shared_device_comm: every collective at 2 and 4 ranks vs the CPU communicator (bitwise; f32 and
#     bf16, ragged, uneven, zero rows), repeated in-place all-reduces, abort mid-collective (PASS/FAIL per test);
#  2. verify-fixture --backend cuda --tp-size 2 and 4 --communicator shared-device on every glm4_moe and
#     glm_moe_dsa fixture (the stand-in's log line must be there; CUDA graphs on vs off are checked too, the joined
#     capture), and once through MXSERVE_COMMUNICATOR;
#  3. greedy tokens of `generate` at tp 2 and 4 on the stand-in equal to tp 1 (glm4_moe_tiny_b, glm_moe_dsa_tiny_b);
#  4. --communicator shared-device with --backend cpu is refused (exit 2, naming the flag).
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
unset MXSERVE_COMMUNICATOR
RC=0
MX="$P/bin/mxserve"
STANDIN_LINE="shared-device communicator: [0-9]+ rank\(s\) on one GPU"

t=test_cuda_shared_device_comm
if [ -x "$P/bin/$t" ]; then
  timeout 240 "$P/bin/$t" --gtest_color=no > "$OUT/$t.log" 2>&1; rc=$?
  echo "== $t rc=$rc"
  grep -E "^\[  (FAILED|  PASSED|  SKIPPED) \]|^\[       OK \]|Failure" "$OUT/$t.log" | head -40
  [ $rc = 0 ] || RC=$rc
else
  echo "FAIL $t: not in this payload"; RC=1
fi

for f in glm4_moe_tiny_a glm4_moe_tiny_b glm_moe_dsa_tiny_a glm_moe_dsa_tiny_b; do
  for tp in 2 4; do
    log="$OUT/standin_verify_${f}_tp$tp.log"
    timeout 360 "$MX" verify-fixture "$P/fixtures/$f" --backend cuda --tp-size $tp --communicator shared-device \
      --max-rel-l2 2e-2 > "$log" 2>&1; rc=$?
    if [ $rc = 0 ] && grep -qE "$STANDIN_LINE" "$log" && grep -q " 0 failed checks" "$log"; then
      echo "PASS verify-fixture $f --tp-size $tp on the stand-in: $(grep -E 'failed checks' "$log" | tail -1)"
    else
      echo "FAIL verify-fixture $f --tp-size $tp on the stand-in: rc=$rc"; grep -E "failed checks|rror|FAIL" "$log" | head -8
      RC=1
    fi
  done
done
log="$OUT/standin_verify_env.log"
MXSERVE_COMMUNICATOR=shared-device timeout 240 "$MX" verify-fixture "$P/fixtures/glm4_moe_tiny_a" --backend cuda \
  --tp-size 2 --max-rel-l2 2e-2 > "$log" 2>&1; rc=$?
if [ $rc = 0 ] && grep -qE "$STANDIN_LINE" "$log"; then echo "PASS MXSERVE_COMMUNICATOR=shared-device tp 2"
else echo "FAIL MXSERVE_COMMUNICATOR=shared-device tp 2: rc=$rc"; tail -3 "$log"; RC=1; fi

for f in glm4_moe_tiny_b glm_moe_dsa_tiny_b; do
  timeout 60 "$MX" generate --model "$P/fixtures/$f" --ids 1,2,3 --max-tokens 12 --backend cuda \
    > "$OUT/standin_gen_${f}_tp1.out" 2> "$OUT/standin_gen_${f}_tp1.err"
  for tp in 2 4; do
    timeout 90 "$MX" generate --model "$P/fixtures/$f" --ids 1,2,3 --max-tokens 12 --backend cuda --tp-size $tp \
      --communicator shared-device > "$OUT/standin_gen_${f}_tp$tp.out" 2> "$OUT/standin_gen_${f}_tp$tp.err"; rc=$?
    if [ $rc = 0 ] && [ -s "$OUT/standin_gen_${f}_tp$tp.out" ] && \
       cmp -s "$OUT/standin_gen_${f}_tp1.out" "$OUT/standin_gen_${f}_tp$tp.out"; then
      echo "PASS generate $f: greedy tokens at tp $tp on the stand-in equal tp 1"
    else
      echo "FAIL generate $f tp $tp: rc=$rc (a difference may be a bf16 near-tie: see the two .out files)"
      diff "$OUT/standin_gen_${f}_tp1.out" "$OUT/standin_gen_${f}_tp$tp.out" | head -6; tail -2 "$OUT/standin_gen_${f}_tp$tp.err"
      RC=1
    fi
  done
done

timeout 30 "$MX" verify-fixture "$P/fixtures/glm4_moe_tiny_a" --tp-size 2 --communicator shared-device \
  > "$OUT/standin_cpu_refused.log" 2>&1; rc=$?
if [ $rc = 2 ] && grep -q -- "--communicator shared-device needs --backend cuda" "$OUT/standin_cpu_refused.log"; then
  echo "PASS --communicator shared-device with --backend cpu refused"
else
  echo "FAIL --communicator shared-device with --backend cpu: rc=$rc"; tail -2 "$OUT/standin_cpu_refused.log"; RC=1
fi
exit $RC
