#!/usr/bin/env bash
# test_quickstart.sh MXSERVE SOURCE_DIR: runs docs/quickstart.md. Every ```bash block of the page, in order, as one
# script (set -euo pipefail) from the repository root, with `build/mxserve` replaced by the binary under test and
# PORT set to a free port; then checks what the steps printed (not only the exit code). The page is the test's
# only source of commands, so the two cannot drift.
set -u
MX=$1
ROOT=$2
page="$ROOT/docs/quickstart.md"
work=$(mktemp -d)
trap 'kill "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null; rm -rf "$work"' EXIT
# The fenced bash blocks, in order.
awk '/^```bash$/ {on = 1; next} /^```$/ {on = 0; next} on' "$page" >"$work/blocks.sh"
n_lines=$(grep -c . "$work/blocks.sh")
[ "$n_lines" -ge 10 ] || { echo "FAIL: only $n_lines command lines extracted from $page" >&2; exit 1; }
grep -q 'build/mxserve' "$work/blocks.sh" || { echo "FAIL: the page runs no build/mxserve command" >&2; exit 1; }
{
  echo 'set -euo pipefail'
  # Record the server's pid for the cleanup trap above, should a later step fail before the page's own kill.
  sed -e "s#build/mxserve#'$MX'#g" -e 's#^SERVER_PID=\$!$#SERVER_PID=$!; echo $SERVER_PID > "'"$work"'/pid"#' "$work/blocks.sh"
} >"$work/run.sh"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# A scratch directory that looks like the repository root (the page's relative paths), so serve.log and
# anything else the page writes stay out of the source tree.
mkdir "$work/root"
for entry in models src docs README.md; do ln -s "$ROOT/$entry" "$work/root/$entry"; done
cd "$work/root" || exit 1
PORT=$port timeout 300 bash "$work/run.sh" >"$work/out.txt" 2>&1
rc=$?
fail=0
check() {  # check DESCRIPTION PERL_REGEX: the combined output must match
  MX_RE=$2 perl -e 'local $/; my $s = <STDIN>; exit($s =~ /$ENV{MX_RE}/s ? 0 : 1)' <"$work/out.txt" ||
    { echo "FAIL: $1 (no match for: $2)" >&2; fail=1; }
}
[ $rc = 0 ] || { echo "FAIL: the quickstart exited $rc" >&2; fail=1; }
check "--version" '(^|\n)mxserve [0-9]+\.[0-9]+\.[0-9]+\ncommit: '
check "--help" 'usage: mxserve <command>'
check "generate --help" 'usage: mxserve generate .*example:'
check "tokenize" '\n\[[0-9]+(,[0-9]+)+\]\n'
check "generate" '\n[0-9]+(,[0-9]+){7}\n'
check "/v1/models" '"id":"tiny"'
check "chat completion" '"object":"chat.completion".*"content":"[^"]+'
check "streamed completion" 'data: \{.*"object":"text_completion".*data: \[DONE\]'
check "bench" 'Requests sent / completed / failed: +12 / 12 / 0'
check "metrics" 'vllm:prompt_tokens_total(\{[^}]*\})? [1-9]'
check "eval perplexity" 'perplexity [0-9.]+ over 255 tokens'
# Piped to a file, the progress is full lines, not \r updates joined on one line.
if grep -q $'\r' "$work/out.txt"; then echo "FAIL: a carriage return in the piped output (progress lines)" >&2; fail=1; fi
check "eval progress lines" '\n256/256 tokens\n'
if [ $fail != 0 ]; then
  echo "---- output of the quickstart ----" >&2
  cat "$work/out.txt" >&2
  [ -f "$work/root/serve.log" ] && { echo "---- serve.log ----" >&2; tail -20 "$work/root/serve.log" >&2; }
  exit 1
fi
echo "ok: docs/quickstart.md ran start to end ($n_lines command lines)"
