// What the GLM-5.x MLA benchmarks share (bench_mla_decode, bench_mla_fp8, bench_mla_sparse_prefill): the latent
// geometry as short constants (kernels/mla_geometry.h: qk_nope 192, rope 64, v 256, kv_lora_rank 512; a cache row
// of 576), the paged cache's 64-token block, and bench_device.h's helpers under their short names. Bench-only:
// the names are global on purpose (one short program each).
#pragma once

#include "kernels/mla_geometry.h"
#include "bench_device.h"

namespace kc = mxserve::kernels::cuda;
using bench::dev_alloc;
using bench::dev_upload;
using bench::rel_l2_bf16;

constexpr int kNope = mxserve::kernels::kGlmMlaNope, kRope = mxserve::kernels::kGlmMlaRope,
              kV = mxserve::kernels::kGlmMlaV, kLora = mxserve::kernels::kGlmMlaLora, kRow = kLora + kRope, kBlock = 64;
