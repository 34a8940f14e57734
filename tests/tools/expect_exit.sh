#!/usr/bin/env bash
# expect_exit.sh: runs a command and checks BOTH its exit code and its output, so a CLI test passes only
# for the reason it names (ctest's WILL_FAIL accepts any non-zero exit, PASS_REGULAR_EXPRESSION ignores
# the exit code, so a crash after the matched text would pass).
# Usage: expect_exit.sh CODE REGEX [--not REGEX] -- COMMAND [ARGS...]
#   CODE   the exact exit status expected (2: usage / bad input, 1: a failed check, 0: success)
#   REGEX  a Perl regular expression that must match stdout+stderr of the command, taken as one string
#          ('.' matches newlines too, as in CMake's PASS_REGULAR_EXPRESSION)
#   --not  REGEX: must NOT match (e.g. a message of an unrelated failure)
# Exit 0 when both hold; otherwise 1 with the command, both expectations and the output.
set -u
if [ $# -lt 4 ]; then
  echo "usage: expect_exit.sh CODE REGEX [--not REGEX] -- COMMAND [ARGS...]" >&2
  exit 2
fi
want_code=$1
want_re=$2
shift 2
not_re=""
if [ "$1" = "--not" ]; then
  not_re=$2
  shift 2
fi
if [ "$1" != "--" ]; then
  echo "expect_exit.sh: expected -- before the command, got '$1'" >&2
  exit 2
fi
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
code=$?
ok=1
if [ "$code" != "$want_code" ]; then
  echo "FAIL: exit code $code, expected $want_code" >&2
  ok=0
fi
matches() {  # matches REGEX FILE: the whole file as one string, /s so that '.' spans lines
  MX_RE=$1 perl -e 'local $/; my $s = <STDIN> // ""; exit($s =~ /$ENV{MX_RE}/s ? 0 : 1)' <"$2"
}
if ! matches "$want_re" "$out"; then
  echo "FAIL: output does not match: $want_re" >&2
  ok=0
fi
if [ -n "$not_re" ] && matches "$not_re" "$out"; then
  echo "FAIL: output matches the forbidden pattern: $not_re" >&2
  ok=0
fi
if [ $ok = 1 ]; then
  echo "ok: exit $code, output matches: $want_re"
  exit 0
fi
echo "command: $*" >&2
echo "---- output (stdout+stderr) ----" >&2
cat "$out" >&2
exit 1
