#!/bin/bash
# Nsight Compute profile of the MXFP4 MoE path (issue 9: what limits decode and prefill), run from a payload
# folder made by dev/make_gpu_payload.sh. For each (shape, M) it profiles the path's kernels (permute, the two
# GEMMs, un-permute) inside `mxserve bench-kernels moe` on the shipped tables, with the clocks left alone
# (--clock-control none) and caches flushed between kernels (ncu's default: decode weights are not L2 hits
# in serving either), and writes one CSV of metrics per run plus a digest:
#   $OUT/ncu_<label>_m<M>.csv      every section's metrics, one row per kernel launch
#   $OUT/ncu_digest.txt            per kernel: duration, DRAM GB/s and % of peak, SM busy, issue-slot use,
#                                  achieved occupancy, waves per SM, grid, registers, warp stalls, pipe use
#                                  (tensor / ALU / FMA / LSU, % of peak), instructions executed
#   usage: moe_profile.sh     (env MOE_PROFILE="label,E,H,I,K,M;..." overrides the runs, MOE_TABLE_DIR the tables)
set -u
P=${MXSERVE_PAYLOAD:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=${OUT:-/tmp/mxserve_gpu}
mkdir -p "$OUT"
BIN="$P/bin"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-missing}"
[ -n "$NCU" ] || exit 3
IFS=';' read -r -a RUNS <<< "${MOE_PROFILE:-air,128,4096,1408,8,1;air,128,4096,1408,8,8;air,128,4096,1408,8,64;air,128,4096,1408,8,8192;glm52,256,6144,2048,8,1}"
SECTIONS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --metrics smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
for run in "${RUNS[@]}"; do
  set -- ${run//,/ }
  label=$1; E=$2; H=$3; I=$4; K=$5; M=$6
  TABLE="${MOE_TABLE_DIR:-$P/configs/moe}/nvidia_h200_E${E}_H${H}_I${I}_K${K}_mxfp4.json"
  [ -s "$TABLE" ] || { echo "no table $TABLE"; continue; }
  # 2 whole calls of the path: 3 (M = 1, direct) or 4 kernels each.
  timeout 120 "$NCU" --clock-control none $SECTIONS -k 'regex:mxfp4|moe_permute|moe_unpermute' --launch-count 8 \
    --csv --page details "$BIN/mxserve" bench-kernels moe --experts $E --hidden $H --inter $I --top-k $K --m $M \
    --table "$TABLE" > "$OUT/ncu_${label}_m${M}.csv" 2> "$OUT/ncu_${label}_m${M}.err"
  echo "ncu $label m=$M rc=$? ($(wc -l < "$OUT/ncu_${label}_m${M}.csv") lines)"
done
# Full SASS of the kernels named by MOE_SASS (a regex on mangled names, default design 5's gate_up
# GEMV), for instruction counts per MMA: $OUT/sass_<function>.txt
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
if [ -x "$CUOBJDUMP" ]; then
  "$CUOBJDUMP" -sass "$BIN/test_cuda_moe_mxfp4" 2>/dev/null | awk -v re="${MOE_SASS:-mxfp4_gv_kernelILi4ELi4ELi1ELb1E}" -v out="$OUT" '
    /Function :/ {f = ($3 ~ re) ? out "/sass_" substr($3, 1, 120) ".txt" : ""}
    f != "" {print > f}'
  ls "$OUT"/sass_* 2>/dev/null
fi
# Digest: the CSV has one row per (launch, section, metric): "ID","Process ID",...,"Kernel Name",...,
# "Section Name","Metric Name","Metric Unit","Metric Value".
python3 - "$OUT" > "$OUT/ncu_digest.txt" 2>&1 <<'PY'
import csv, glob, os, re, sys
want = ["Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Issue Slots Busy",
        "Executed Ipc Active", "Achieved Occupancy", "Theoretical Occupancy", "Waves Per SM", "Grid Size",
        "Block Size", "Registers Per Thread", "Dynamic Shared Memory Per Block", "L2 Hit Rate", "Mem Busy",
        "Max Bandwidth", "No Eligible", "Warp Cycles Per Issued Instruction", "Active Warps Per Scheduler",
        "Eligible Warps Per Scheduler", "One or More Eligible"]
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ncu_*.csv"))):
    rows = [r for r in csv.reader(open(f, errors="replace"))]
    hdr = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if hdr is None:
        print(f"== {os.path.basename(f)}: no data"); continue
    h = rows[hdr]; ix = {k: h.index(k) for k in h}
    kern = {}
    for r in rows[hdr + 1:]:
        if len(r) <= ix["Metric Value"]: continue
        key = (int(r[ix["ID"]]), re.sub(r"\(.*", "", r[ix["Kernel Name"]])[:90])
        kern.setdefault(key, []).append((r[ix["Section Name"]], r[ix["Metric Name"]], r[ix["Metric Unit"]], r[ix["Metric Value"]]))
    print(f"== {os.path.basename(f)}")
    for (i, name), ms in sorted(kern.items()):
        print(f"  [{i}] {name}")
        for s, m, u, v in ms:
            if m in want or "stall" in m.lower() or "pipe" in m or "inst_executed" in m:
                print(f"      {m} = {v} {u}")
PY
head -c 30000 "$OUT/ncu_digest.txt"
