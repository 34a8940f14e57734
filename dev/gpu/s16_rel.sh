#!/bin/bash
# Session 16, issue 33: the 10-minute run at the knee (reliability.sh: memory over time, /metrics, a client that hangs
# up), longer than one device call. Two calls on one warm machine:
#   REL_PHASE=start: copies the payload to /tmp/mx_rel_payload (a later call's carry replaces .gpu_payload under a
#     running bash) and starts reliability.sh there with setsid, its output in /tmp/mx_rel; then waits up to
#     $REL_WAIT s (default 540), printing the metrics every 60 s, and returns what it has so far.
#   REL_PHASE=collect: waits (up to $REL_WAIT s) for the run to end, then copies /tmp/mx_rel into $OUT.
# Serve flags: $MX_FLAGS (reliability.sh; e.g. --step-log /tmp/mx_rel/steps.jsonl), pool $REL_KV, rate $REL_RATE,
# requests $REL_N. Output: $OUT/rel.tar.gz (all of /tmp/mx_rel), stdout.log and metrics_over_time.txt.
set -u
OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p "$OUT"
RUN=/tmp/mx_rel; RP=/tmp/mx_rel_payload
WAIT=${REL_WAIT:-540}
# Everything in one archive (the device tool returns few files), the summaries beside it.
snapshot() {
  tar -czf "$OUT/rel.tar.gz" -C "$RUN" . 2>/dev/null
  cp "$RUN/stdout.log" "$RUN/metrics_over_time.txt" "$OUT/" 2>/dev/null
  tail -3 "$RUN/metrics_over_time.txt" 2>/dev/null
}
if [ "${REL_PHASE:-start}" = start ]; then
  P=$(cd "$(dirname "$0")/.." && pwd)
  rm -rf "$RUN" "$RP"; mkdir -p "$RUN"; cp -r "$P" "$RP"
  # The binaries and libraries unpacked in the copy, LD_LIBRARY_PATH over them (reliability.sh keeps curl off it).
  (MXSERVE_PAYLOAD=$RP OUT=$RUN; . "$RP/gpu/payload_env.sh")
  CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
  export LD_LIBRARY_PATH="$RP/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
  echo "rate ${REL_RATE:-} n ${REL_N:-} kv ${REL_KV:-} flags ${MX_FLAGS:-}" > "$RUN/params.txt"
  MXSERVE_PAYLOAD=$RP OUT=$RUN setsid nohup bash "$RP/gpu/reliability.sh" > "$RUN/stdout.log" 2>&1 < /dev/null &
  echo $! > "$RUN/pid"
fi
pid=$(cat "$RUN/pid")
start=$(date +%s)
while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - start )) -lt "$WAIT" ]; do
  sleep 20
  [ $(( ($(date +%s) - start) % 60 )) -lt 20 ] && tail -1 "$RUN/metrics_over_time.txt" 2>/dev/null
done
kill -0 "$pid" 2>/dev/null && echo "still running after ${WAIT}s (collect in the next call)" || echo "finished"
snapshot
cat "$RUN/stdout.log" 2>/dev/null | tail -40
