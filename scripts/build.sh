#!/usr/bin/env bash
# Configures and builds mxserve into build/ (Release). CUDA code is built for sm_90a when nvcc exists.
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${MXSERVE_BUILD_DIR:-build}
JOBS=${MXSERVE_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
