#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every CPU test (unit, fuzz, model fixtures).
# GPU tests (label gpu) are run on a GPU machine with: ctest --test-dir build -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir "${MXSERVE_BUILD_DIR:-build}" -L cpu --output-on-failure -j "$(nproc)" --timeout 900
