#!/bin/bash
# One device call, many stages: runs the named GPU stages from a payload folder (dev/make_gpu_payload.sh),
# each with its own time limit and log folder, then packs every log into $OUT/logs.tar.gz (the device
# tool returns at most 8 files) and prints each stage's summary.
#   usage: dev/gpu/run_all.sh PAYLOAD STAGE[:SECONDS] ...
#   stages: check (gpu_check.sh --no-bench), kernels (bench_cuda_kernels), moe (moe_mxfp4.sh),
#           model (bench_model.sh), spec (spec_perf.sh), or any dev/gpu/NAME.sh copied into the payload.
set -u
P=$(cd "$1" && pwd); shift
export MXSERVE_PAYLOAD="$P"
FINAL_OUT=${OUT:-/tmp/mxserve_gpu}
WORK=/tmp/mxserve_stages
rm -rf "$WORK"; mkdir -p "$WORK" "$FINAL_OUT"
: > "$WORK/summary.txt"
# The binaries and the libraries the GPU image may lack travel compressed in the payload (dev/make_gpu_payload.sh).
[ -d "$P/bin" ] || tar -xJf "$P/bin.tar.xz" -C "$P"
mkdir -p "$P/lib" && tar -xJf "$P/libs.tar.xz" -C "$P/lib"
touch "$P/bin/.unpacked" "$P/lib/.unpacked"  # payload_env.sh: already unpacked, stages do not redo it
CUBLAS_PIP=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64:${CUBLAS_PIP}:${LD_LIBRARY_PATH:-}"
export MXSERVE_FIXTURE_ROOT="$P/fixtures" MXSERVE_CONFIG_ROOT="$P/configs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$WORK/gpu.txt" 2>&1
cat "$P/commit.txt" >> "$WORK/gpu.txt" 2>/dev/null
for spec in "$@"; do
  name=${spec%%:*}; limit=${spec#*:}; [ "$limit" = "$spec" ] && limit=300
  mkdir -p "$WORK/$name"
  start=$(date +%s)
  case $name in
    check)   cmd=(bash "$P/gpu_check.sh" --no-bench) ;;
    kernels) cmd=("$P/bin/bench_cuda_kernels" --md "$WORK/kernels/bench.md") ;;
    moe)     cmd=(bash "$P/gpu/moe_mxfp4.sh") ;;
    model)   cmd=(bash "$P/gpu/bench_model.sh") ;;
    spec)    cmd=(bash "$P/gpu/spec_perf.sh") ;;
    *)       cmd=(bash "$P/gpu/$name.sh") ;;
  esac
  OUT="$WORK/$name" timeout "$limit" "${cmd[@]}" > "$WORK/$name/stdout.log" 2>&1
  rc=$?
  echo "==== stage $name rc=$rc ($(( $(date +%s) - start )) s of $limit)" | tee -a "$WORK/summary.txt"
  tail -40 "$WORK/$name/stdout.log" >> "$WORK/summary.txt"
  # After every stage, so a call cut short still returns what finished.
  tar -czf "$FINAL_OUT/logs.tar.gz" -C "$WORK" .
  cp "$WORK/summary.txt" "$FINAL_OUT/summary.txt"
done
cat "$WORK/summary.txt"
