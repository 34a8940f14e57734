#!/usr/bin/env bash
# test_cli_help.sh MXSERVE: every command and subcommand (`mxserve help --commands`) answers --help with exit 0,
# its usage line and an example, and the flags its help lists are exactly the flags its parser accepts
# (MXSERVE_HELP_ACCEPTED_FLAGS=1 makes cli::Args print the parser's set): the help cannot drift from the parser.
# `mxserve help CMD` prints the same text as `mxserve CMD --help`. bench prints its own help (src/bench): only its
# exit code and usage line are checked.
set -u
MX=$1
fail=0
say() { echo "FAIL: $*" >&2; fail=1; }
commands=$("$MX" help --commands) || { echo "FAIL: mxserve help --commands exited $?" >&2; exit 1; }
n=0
while IFS= read -r cmd; do
  [ -z "$cmd" ] && continue
  n=$((n + 1))
  # shellcheck disable=SC2086  # "eval perplexity" is two words on purpose
  out=$("$MX" $cmd --help 2>&1); rc=$?
  [ $rc = 0 ] || { say "'mxserve $cmd --help' exited $rc: $out"; continue; }
  grep -q "^usage: mxserve $cmd" <<<"$out" || say "'mxserve $cmd --help' has no 'usage: mxserve $cmd' line"
  [ "$cmd" = bench ] || grep -q "^example:" <<<"$out" || say "'mxserve $cmd --help' has no example"
  # shellcheck disable=SC2086
  via_help=$("$MX" help $cmd 2>&1); rc=$?
  [ $rc = 0 ] && [ "$via_help" = "$out" ] || say "'mxserve help $cmd' (exit $rc) differs from 'mxserve $cmd --help'"
  [ "$cmd" = bench ] && continue
  # A command with subcommands dispatches before any parser: its help lists the subcommands instead.
  if grep -q "^subcommands" <<<"$out"; then continue; fi
  listed=$(grep -oE '^  --[a-z0-9-]+' <<<"$out" | sed 's/^  //' | grep -vx -- '--help' | sort -u)
  # shellcheck disable=SC2086
  accepted=$(MXSERVE_HELP_ACCEPTED_FLAGS=1 "$MX" $cmd --help 2>&1 | sort -u)
  if [ "$listed" != "$accepted" ]; then
    say "'mxserve $cmd --help' lists flags the parser does not take, or misses some:"
    diff <(echo "$listed") <(echo "$accepted") | sed 's/^</  only in help:/; s/^>/  only in the parser:/' >&2
  fi
done <<<"$commands"
[ $n -ge 18 ] || say "only $n commands listed by 'mxserve help --commands' (expected every command, 18+)"
[ $fail = 0 ] && echo "ok: $n commands: --help exit 0, usage, example, flags == the parser's"
exit $fail
