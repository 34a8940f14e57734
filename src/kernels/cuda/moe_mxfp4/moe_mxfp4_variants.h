// The ONE list of MXFP4 MoE kernel variants (issue 15). Plain C++ (no CUDA): the variant ids, their names
// (what tuned tables store), their design and template parameters all come from MXSERVE_MOE_MXFP4_VARIANTS
// below; the dispatch (moe_mxfp4.cu) and each design's template instantiations (moe_mxfp4_<design>.cu,
// through mxfp4_design_launchers in moe_mxfp4_internal.h) are generated from the same rows.
//
// Key invariants: a name is never renamed or reused (tuned tables store names; an unknown name is an error
// naming the table file at start-up); a variant that no tuned table and no rule picks is retired by moving its
// name to MXSERVE_MOE_MXFP4_RETIRED (a table that names it then fails validation saying "retired"); new
// variants go at the end; names are unique across both lists (checked at compile time below). Adding a
// variant of an existing design = one row here; the GPU suite (test_cuda_moe_mxfp4) then checks it against the
// CPU reference and `mxserve tune-moe` offers it.
#pragma once

#include <cstdint>
#include <iterator>
#include <string_view>

namespace mxserve::kernels::cuda {

// The kernel designs, numbered as in docs/cuda.md ("MXFP4 MoE kernels"); one translation unit each.
// Numbers are never reused: designs 1 (simt, CUDA-core GEMV), 3 (dec, decode split K) and 7 (gva, design 5
// with a cp.async ring) were retired in issue 31 (no tuned table and no rule picked them; see
// kMoeMxfp4RetiredDesigns and docs/cuda.md).
enum class MoeMxfp4Design : uint8_t {
  kTc = 2,    // moe_mxfp4_tc.cu    mma.sync, weights global -> registers; P0 warps x 16 rows, P1 rows a pass
  kPf = 4,    // moe_mxfp4_pf.cu    prefill cp.async ring: 128 weight rows x 16 P0 tokens per block
  kGv = 5,    // moe_mxfp4_gv.cu    decode GEMV: P0 tiles per block, P1 k steps in flight, P2 warps per tile
  kWg = 6,    // moe_mxfp4_wg.cu    prefill, Hopper wgmma (sm_90a): 128 rows x P0 weight rows, P1-stage ring
  kWg8 = 8,   // moe_mxfp4_wg8.cu   design 6 in W4A8 (e4m3 tokens and weights, sm_90a): P0 weight rows, P1 stages,
              //                    P2 expert rows per tile (0: 128);
              //                    only with MoeShape::fp8_activations (the dispatcher swaps wg_* for it)
  kPd = 9,    // moe_mxfp4_pd.cu    persistent decode path (issue 33): a whole call in 2 launches, so NO per-GEMM
              //                    row below; chosen by moe_mxfp4_pd_enabled (moe_mxfp4_pd.h: kMoeMxfp4PdDefault)
};

// X(id, name, design, P0, P1, P2). The name describes the row:
//   tc_w{64,128}_t{T}   design 2: {4,8} warps (64/128 weight rows) per block, T expert rows per pass
//   pf_t{T}             design 4: T = 16 P0 tokens per block
//   gv_w{W}_d{D}[_k2]   design 5: W tiles per block, D k steps in flight; _k2: two warps per tile
//   wg_n{BN}_s{S}       design 6: BN weight rows (wgmma N) per block, S cp.async stages of 64-wide k steps
//   wg8_n{BN}_s{S}[_m256] design 8: BN weight rows (wgmma N) per block, S cp.async stages of 128-wide k steps;
//                       _m256: 256 expert rows per tile (P2; default 128)
#define MXSERVE_MOE_MXFP4_VARIANTS(X)              \
  X(kTcW64T8, "tc_w64_t8", kTc, 4, 8, 0)           \
  X(kTcW128T8, "tc_w128_t8", kTc, 8, 8, 0)         \
  X(kTcW128T16, "tc_w128_t16", kTc, 8, 16, 0)      \
  X(kTcW128T32, "tc_w128_t32", kTc, 8, 32, 0)      \
  X(kTcW128T64, "tc_w128_t64", kTc, 8, 64, 0)      \
  X(kPfT64, "pf_t64", kPf, 4, 0, 0)                \
  X(kPfT128, "pf_t128", kPf, 8, 0, 0)              \
  X(kGvW4D4, "gv_w4_d4", kGv, 4, 4, 1)             \
  X(kGvW4D8, "gv_w4_d8", kGv, 4, 8, 1)             \
  X(kGvW1D4, "gv_w1_d4", kGv, 1, 4, 1)             \
  X(kGvW1D8, "gv_w1_d8", kGv, 1, 8, 1)             \
  X(kGvW4D4K2, "gv_w4_d4_k2", kGv, 4, 4, 2)        \
  X(kGvW2D8K2, "gv_w2_d8_k2", kGv, 2, 8, 2)        \
  X(kWgN256S4, "wg_n256_s4", kWg, 256, 4, 0)       \
  X(kWgN128S3, "wg_n128_s3", kWg, 128, 3, 0)       \
  X(kWg8N256S4, "wg8_n256_s4", kWg8, 256, 4, 0)    \
  X(kWg8N128S3, "wg8_n128_s3", kWg8, 128, 3, 0)    \
  X(kWg8N128S3M256, "wg8_n128_s3_m256", kWg8, 128, 3, 256)

// Retired names (never reused; a tuned table naming one is rejected at start-up as "retired"). Issue 31 retired
// designs 1, 3 and 7: no configs/moe table and no rule (moe_mxfp4_heuristic_plan) picked any of them, and
// `mxserve tune-moe` no longer times them. The kernels are in git history (before issue 31's retirement commit).
#define MXSERVE_MOE_MXFP4_RETIRED(X) \
  X("simt_r4", 1)                    \
  X("dec_s4_r2", 3)                  \
  X("dec_s4_r4", 3)                  \
  X("dec_s8_r2", 3)                  \
  X("dec_s2_r4", 3)                  \
  X("dec_s4_r4_o2", 3)               \
  X("dec_s2_r4_o2", 3)               \
  X("dec_s8_r4_o2", 3)               \
  X("gva_w4_s8", 7)                  \
  X("gva_w2_s12", 7)                 \
  X("gva_w4_s6", 7)

// Variant ids = row indices of the list (what MoeMxfp4Plan holds). Used as moe_mxfp4_variant::kGvW4D4.
namespace moe_mxfp4_variant {
enum Id : int {
#define MXSERVE_MOE_MXFP4_ID(id, name, design, p0, p1, p2) id,
  MXSERVE_MOE_MXFP4_VARIANTS(MXSERVE_MOE_MXFP4_ID)
#undef MXSERVE_MOE_MXFP4_ID
  kCount
};
}  // namespace moe_mxfp4_variant

inline constexpr int kMoeMxfp4NumVariants = moe_mxfp4_variant::kCount;

struct MoeMxfp4VariantInfo {
  std::string_view name;
  MoeMxfp4Design design;
  int p0, p1, p2;  // the design's template parameters (see MoeMxfp4Design)
};

inline constexpr MoeMxfp4VariantInfo kMoeMxfp4Variants[kMoeMxfp4NumVariants] = {
#define MXSERVE_MOE_MXFP4_INFO(id, name, design, p0, p1, p2) {name, MoeMxfp4Design::design, p0, p1, p2},
    MXSERVE_MOE_MXFP4_VARIANTS(MXSERVE_MOE_MXFP4_INFO)
#undef MXSERVE_MOE_MXFP4_INFO
};

// The id of a variant name, or -1.
constexpr int moe_mxfp4_variant_id(std::string_view name) {
  for (int v = 0; v < kMoeMxfp4NumVariants; ++v)
    if (kMoeMxfp4Variants[v].name == name) return v;
  return -1;
}

struct MoeMxfp4RetiredVariant {
  std::string_view name;
  int design;  // the retired design's number (no MoeMxfp4Design member any more)
};
inline constexpr MoeMxfp4RetiredVariant kMoeMxfp4RetiredVariants[] = {
#define MXSERVE_MOE_MXFP4_RETIRED_ROW(name, design) {name, design},
    MXSERVE_MOE_MXFP4_RETIRED(MXSERVE_MOE_MXFP4_RETIRED_ROW)
#undef MXSERVE_MOE_MXFP4_RETIRED_ROW
};
// The design numbers retired so far (no live variant may use one; a new design takes the next free number).
inline constexpr int kMoeMxfp4RetiredDesigns[] = {1, 3, 7};
// What moe_mxfp4_variant_index returns for a retired name (-1 stays "unknown"): validate_moe_tuning
// (kernels/moe_tuning.h) reads -2 as retired and says so, naming the table.
inline constexpr int kMoeMxfp4RetiredVariant = -2;

constexpr bool moe_mxfp4_variant_retired(std::string_view name) {
  for (const MoeMxfp4RetiredVariant& r : kMoeMxfp4RetiredVariants)
    if (r.name == name) return true;
  return false;
}

constexpr bool moe_mxfp4_variant_names_unique() {
  for (int v = 0; v < kMoeMxfp4NumVariants; ++v)
    if (moe_mxfp4_variant_id(kMoeMxfp4Variants[v].name) != v ||
        moe_mxfp4_variant_retired(kMoeMxfp4Variants[v].name))
      return false;
  for (size_t i = 0; i < std::size(kMoeMxfp4RetiredVariants); ++i)
    for (size_t j = 0; j < i; ++j)
      if (kMoeMxfp4RetiredVariants[i].name == kMoeMxfp4RetiredVariants[j].name) return false;
  return true;
}
static_assert(moe_mxfp4_variant_names_unique(),
              "MXSERVE_MOE_MXFP4_VARIANTS / _RETIRED: a variant name is listed twice (or live and retired)");

constexpr bool moe_mxfp4_retired_designs_unused() {
  for (int d : kMoeMxfp4RetiredDesigns)
    for (const MoeMxfp4VariantInfo& v : kMoeMxfp4Variants)
      if (static_cast<int>(v.design) == d) return false;
  for (const MoeMxfp4RetiredVariant& r : kMoeMxfp4RetiredVariants) {
    bool listed = false;
    for (int d : kMoeMxfp4RetiredDesigns) listed = listed || d == r.design;
    if (!listed) return false;
  }
  return true;
}
static_assert(moe_mxfp4_retired_designs_unused(),
              "kMoeMxfp4RetiredDesigns: a retired design number is used by a live variant (or a retired name's "
              "design is not listed)");

}  // namespace mxserve::kernels::cuda
