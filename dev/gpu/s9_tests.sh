#!/bin/bash
# Session 9: a list of GPU test binaries in one stage, each with its own time limit and gtest filter, in the order
# given (the most important first, so a call cut short keeps those). S9_TESTS="bin:seconds[:filter] ...".
# Prints one line per binary (rc, passed / failed counts) and the failure lines; logs in $OUT/t_BIN.log.
set -u
. "$(dirname "$0")/payload_env.sh"
export MXSERVE_FIXTURE_ROOT="$P/fixtures"
unset MXSERVE_COMMUNICATOR MXSERVE_TP_GRAPHS
RC=0
for spec in ${S9_TESTS:-}; do
  IFS=: read -r bin secs filter <<< "$spec"
  args=(--gtest_color=no); [ -n "${filter:-}" ] && args+=("--gtest_filter=$filter")
  start=$(date +%s)
  timeout "${secs:-200}" "$P/bin/$bin" "${args[@]}" > "$OUT/t_$bin.log" 2>&1; rc=$?
  echo "== $bin rc=$rc ($(( $(date +%s) - start )) s) ok=$(grep -c '^\[       OK' "$OUT/t_$bin.log") failed=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/t_$bin.log") skipped=$(grep -c '^\[  SKIPPED' "$OUT/t_$bin.log")"
  grep -E "^\[  FAILED  \] [A-Za-z]|Failure$|CHECK failed|^\[ judged  \]|^PASS-|replays|cascade launches" "$OUT/t_$bin.log" | cut -c1-300 | head -14
  [ $rc = 0 ] || RC=1
done
exit $RC
