#!/bin/bash
# The whole GPU suite (gpu_check.sh --no-bench) with every launch-based test running its collectives through a
# one-rank NCCL communicator (MXSERVE_COMMUNICATOR=nccl, docs/parallel.md): issue 19's "the one-rank NCCL path
# passes the GPU suite". NCCL comes from the image's pip wheel when the loader does not find libnccl.so.2.
# Run by run_all.sh (needs its LD_LIBRARY_PATH).
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
NCCL_PIP=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:${NCCL_PIP}"
export MXSERVE_COMMUNICATOR=nccl NCCL_NVLS_ENABLE=0
echo "MXSERVE_COMMUNICATOR=nccl, NCCL from ${NCCL_PIP:-the loader path}"
bash "$P/gpu_check.sh" --no-bench
