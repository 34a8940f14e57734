# Sourced by the dev/gpu/*.sh stages (`. "$(dirname "$0")/payload_env.sh"`), on the GPU machine, from a payload
# folder made by dev/make_gpu_payload.sh: P (MXSERVE_PAYLOAD, else the folder above the stage's own) and B=$P/bin,
# OUT (default /tmp/mxserve_gpu, created), the payload's packed libraries unpacked into $P/lib and its packed
# binaries into $P/bin (when mxserve is not there yet), LD_LIBRARY_PATH over $P/lib, CUDA's lib64 and pip's cuBLAS
# (when installed), and t MESSAGE: a line stamped with the seconds since this file was sourced.
# Each stage still sets what is its own (MXSERVE_FIXTURE_ROOT, MXSERVE_CONFIG_ROOT, ...).
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
B=$P/bin
OUT=${OUT:-/tmp/mxserve_gpu}
mkdir -p "$OUT" "$P/lib"
# Unpacked once under a lock: stages started side by side (dev/gpu/s9_c1.sh's lanes) must not rewrite a binary
# another stage is executing ("Text file busy"); a marker says the unpack finished.
(
  flock 9
  if [ -f "$P/libs.tar.xz" ] && [ ! -f "$P/lib/.unpacked" ]; then tar -xJf "$P/libs.tar.xz" -C "$P/lib" && touch "$P/lib/.unpacked"; fi
  if [ -f "$P/bin.tar.xz" ] && [ ! -f "$P/bin/.unpacked" ]; then tar -xJf "$P/bin.tar.xz" -C "$P" && touch "$P/bin/.unpacked"; fi
) 9> "$P/.unpack.lock"
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
T0=$(date +%s)
t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
