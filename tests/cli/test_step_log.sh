#!/usr/bin/env bash
# test_step_log.sh MXSERVE MODEL: the step log end to end (docs/scheduling.md "Recording the steps").
# 1. `simulate --fit-step-log` on a log made here from known coefficients (no noise) prints the record count, the
#    class table and a --step-cost whose coefficients are the known ones within 5%.
# 2. `serve --step-log` on the tiny model writes one line per engine step: a completion of 8 tokens takes at least
#    8 steps; after SIGTERM the file holds them, every line in the documented format, and the fit reads it.
set -u
MX=$1 MODEL=$2
work=$(mktemp -d)
trap 'kill "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null; rm -rf "$work"' EXIT
fail=0
say() { echo "FAIL: $*" >&2; fail=1; }

# 1. 400 steps: 8-16 decodes at 10k-20k context (a third graph replays), every 8th step an 8k chunk after 0-16k
# cached tokens; seconds = 0.02 + 5e-5 pt + 5e-9 pp + 3e-4 dr + 4e-8 dkv.
awk 'BEGIN {
  srand(7); t = 0
  for (i = 0; i < 400; i++) {
    dr = 8 + int(rand() * 9); dkv = 0
    for (d = 0; d < dr; d++) dkv += 10000 + int(rand() * 10000)
    pt = 0; pp = 0; pc = 0; g = 0
    if (i % 8 == 0) { start = int(rand() * 16384); pt = 8192; pp = 8192 * (start + 8193 / 2); pc = 1 }
    else if (rand() < 1 / 3) g = 1
    s = 0.02 + 5e-5 * pt + 5e-9 * pp + 3e-4 * dr + 4e-8 * dkv
    printf "{\"t\":%.9g,\"s\":%.9g,\"pt\":%d,\"pp\":%.17g,\"dr\":%d,\"dkv\":%d,\"pc\":%d,\"ds\":%d,\"g\":%d,\"pred\":null}\n",
           t, s, pt, pp, dr, dkv, pc, dr, g
    t += s
  }
}' >"$work/synthetic.jsonl"
out=$("$MX" simulate --fit-step-log "$work/synthetic.jsonl" 2>&1); rc=$?
[ $rc = 0 ] || say "simulate --fit-step-log exited $rc: $out"
grep -q "^step log $work/synthetic.jsonl: 400 records (" <<<"$out" || say "no record count line: $out"
for row in "online | decode-only, eager" "online | decode-only, graph" "online | with prefill" \
           "batch | decode-only, eager" "batch | decode-only, graph" "batch | with prefill"; do
  grep -qF "| $row | " <<<"$out" || say "no table row '$row': $out"
done
cost=$(sed -n 's/.*--step-cost \([^ ]*\)$/\1/p' <<<"$out")
awk -v got="$cost" 'BEGIN {
  n = split(got, g, ","); split("0.02,5e-5,5e-9,3e-4,4e-8", want, ",")
  if (n != 5) exit 1
  for (i = 1; i <= 5; i++) if (g[i] < 0.95 * want[i] || g[i] > 1.05 * want[i]) exit 1
}' || say "--step-cost '$cost' is not 0.02,5e-5,5e-9,3e-4,4e-8 within 5%: $out"

# 2. The tiny model served with --step-log.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$MX" serve --model "$MODEL" --port "$port" --step-log "$work/steps.jsonl" >"$work/serve.log" 2>&1 &
echo $! >"$work/pid"
for _ in $(seq 1 100); do curl -sf "127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
curl -sf "127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt":"The city council met on Tuesday.","max_tokens":8,"ignore_eos":true}' >"$work/completion.json" ||
  say "the completion failed: $(tail -5 "$work/serve.log")"
kill -TERM "$(cat "$work/pid")"
wait "$(cat "$work/pid")" || say "serve exited $? after SIGTERM: $(tail -5 "$work/serve.log")"
rm -f "$work/pid"
grep -q "step log: one JSON line per engine step to $work/steps.jsonl" "$work/serve.log" ||
  say "serve did not log where the step log goes: $(grep -i step "$work/serve.log")"
lines=$(grep -c . "$work/steps.jsonl" 2>/dev/null || echo 0)
[ "$lines" -ge 8 ] || say "$lines step log lines for a completion of 8 tokens (wanted >= 8)"
num='(-?[0-9.]+(e[-+][0-9]+)?)'
bad=$(grep -cvE "^\{\"t\":$num,\"s\":$num,\"pt\":$num,\"pp\":$num,\"dr\":$num,\"dkv\":$num,\"pc\":[0-9]+,\"ds\":[0-9]+,\"g\":[01],\"pred\":($num|null)\}$" "$work/steps.jsonl")
[ "$bad" = 0 ] || say "$bad step log lines not in the documented format: $(head -3 "$work/steps.jsonl")"
head -1 "$work/steps.jsonl" | grep -qE '^\{"t":0,.*"pt":[1-9].*"pred":null\}$' ||
  say "the first step starts the clock, carries the prompt and has no prediction: $(head -1 "$work/steps.jsonl")"
fit=$("$MX" simulate --fit-step-log "$work/steps.jsonl" 2>&1) || say "the fit of the served log exited $?: $fit"
grep -q ": $lines records (" <<<"$fit" || say "the fit did not count $lines records: $fit"
[ $fail = 0 ] && echo "ok: the synthetic log fitted within 5%; serve wrote $lines steps in the documented format"
exit $fail
