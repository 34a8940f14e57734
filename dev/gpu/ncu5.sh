#!/bin/bash
# Nsight Compute counters (clocks left alone) of session 5's kernels: wgmma_ws attention (8192-token chunk) and the
# W4A8 wg8_n128_s3_m256 gate_up at M = 8192 (GLM-4.5-Air).
P=${MXSERVE_PAYLOAD}; OUT=${OUT:-/tmp/mxserve_gpu}; mkdir -p $OUT
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats"
timeout 45 $NCU --clock-control none --kill yes $S -k regex:paged_attention_wgmma_ws --launch-count 1 $P/bin/bench_prefill_attention --quick > $OUT/ncu_ws.txt 2>&1; echo "ws rc=$?"
timeout 50 $NCU --clock-control none --kill yes $S --kernel-name-base demangled -k 'regex:mxfp4_wg8_kernel<.*3, [^,]*256,' --launch-count 1 $P/bin/bench_moe_mxfp4_wg 8192 > $OUT/ncu_wg8.txt 2>&1; echo "wg8 rc=$?"
for f in ncu_ws ncu_wg8; do echo "== $f"; grep -E "wg8_kernel|wgmma_ws_kernel|Duration|Throughput|pipeline|Ipc Active|Issue Slots|Eligible|Registers Per|Occupancy|Warp Cycles Per Issued|Bank|Block Limit (Reg|Shared)" $OUT/$f.txt | cut -c1-160 | head -40; done
