// The FP8 E4M3 K/V tile loader of the tensor-core attention kernels (paged_attention_mma.cu: per-warp decode and
// block-shared prefill; cascade_attention.cu: prefix and suffix passes), shared by all four:
//   issue:    cp.async of one tile's raw bytes (16 codes = 16 B per copy, the keys' K and V scales 4 B each) into
//             a pipeline stage, the same stage count as the bf16 cache's cp.async pipeline;
//   dequant:  stage -> one bf16 tile in shared memory (row stride HD + 8, what process_tile reads) with the
//             plain loader's arithmetic (fp8x8_to_bf16, kv_fp8_load.cuh): the tile is bit for bit the one the
//             plain loader stores, so results are bit-identical to it.
// A stage is [K codes KEYS x HD][V codes KEYS x HD][K scales KEYS][V scales KEYS] (bytes, floats), packed rows; the
// index math lives in kv_fp8_tile_layout.h (emulated on the host by a CPU test).
// Invariant: a row whose slot is < 0 (past the end, tree-masked) is zero-filled, codes and scales, and dequantizes
// to +0 like the plain loader's zero fill (0 * 0 = +0: finite, then masked by process_tile).
// The loader is a template parameter of the kernels (KvLoad): no runtime branch in any tile load (a runtime FP8
// branch once cost the bf16 decode kernel 13%). The old plain loader stays selectable (kv_fp8_load_mode.h).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention/kv_fp8_load.cuh"
#include "kernels/cuda/attention/kv_fp8_load_mode.h"
#include "kernels/cuda/attention/kv_fp8_tile_layout.h"
#include "kernels/cuda/attention/paged_attention_mma_tile.cuh"
#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

// How a kernel instantiation loads its K/V tiles.
enum class KvLoad : int {
  kBf16 = 0,       // bf16 cache: cp.async of the values (unchanged)
  kFp8Plain = 1,   // FP8 cache: plain loads dequantized in registers, stored as bf16 (the old loader)
  kFp8Async = 2,   // FP8 cache: this file's cp.async pipeline of raw codes, dequantized from shared memory
};

template <int HD, int KEYS>
struct Fp8Stage {
  static constexpr size_t kBytes = kv_fp8_tile::stage_bytes(HD, KEYS);
  static_assert(HD % kv_fp8_tile::kIssueBytes == 0 && kBytes % 16 == 0, "stages must keep 16-byte alignment");
  static_assert(kv_fp8_tile::bf16_row_stride(HD) == mma_tile::row_stride<HD>(), "the tile process_tile reads");
};

// Shared memory of one tile pipeline of `stages` stages (kv_fp8_tile_layout.h).
template <int HD, int KEYS, KvLoad L>
constexpr size_t kv_pipeline_bytes(int stages) {
  return kv_fp8_tile::pipeline_bytes(HD, KEYS, stages, L == KvLoad::kFp8Async);
}

// The bf16 tile (K rows then V rows) of an FP8 async pipeline at `region` (after its raw stages).
template <int HD, int KEYS>
__device__ __forceinline__ bf16* fp8_dequant_tile(unsigned char* region, int stages) {
  return reinterpret_cast<bf16*>(region + stages * Fp8Stage<HD, KEYS>::kBytes);
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mma_tile::smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

// The cache slot of `key` through a block table, or -1 where the key is not `visible` (the row map slot_of below).
__device__ __forceinline__ int64_t table_slot_or_none(bool visible, int key, const int32_t* table, int block_size) {
  return visible ? static_cast<int64_t>(table[key / block_size]) * block_size + key % block_size : -1;
}

// Issues the cp.async copies of one tile into `stage` (threads tid = 0 .. NT - 1 of the pipeline's owners; the
// caller commits). slot_of(j): the cache slot of tile row j, or < 0 for a row to zero-fill.
template <int HD, int KEYS, int NT, class SlotOf>
__device__ __forceinline__ void fp8_tile_issue(unsigned char* stage, int tid, const void* k_cache, const void* v_cache,
                                               int kvh, const AttentionParams& p, SlotOf slot_of) {
  namespace L = kv_fp8_tile;
  const auto* kc = static_cast<const uint8_t*>(k_cache);
  const auto* vc = static_cast<const uint8_t*>(v_cache);
#pragma unroll
  for (int c = tid; c < L::issue_chunks(HD, KEYS); c += NT) {
    const L::Chunk ch = L::issue_chunk(HD, c);
    const int64_t slot = slot_of(ch.row);
    const bool ok = slot >= 0;
    const int64_t off = ok ? L::cache_code_at(slot, p.n_kv_heads, HD, kvh, ch.col) : 0;
    mma_tile::cp_async16(stage + L::k_code_at(HD, ch.row, ch.col), kc + off, ok);
    mma_tile::cp_async16(stage + L::v_code_at(HD, KEYS, ch.row, ch.col), vc + off, ok);
  }
#pragma unroll
  for (int j = tid; j < KEYS; j += NT) {
    const int64_t slot = slot_of(j);
    const bool ok = slot >= 0;
    const int64_t s = ok ? slot * p.n_kv_heads + kvh : 0;
    cp_async4(stage + L::k_scale_at(HD, KEYS, j), p.k_scales + s, ok);
    cp_async4(stage + L::v_scale_at(HD, KEYS, j), p.v_scales + s, ok);
  }
}

// Dequantizes a landed stage into the bf16 tile kd / vd (row stride HD + 8) by threads tid = 0 .. NT - 1: 8 codes
// per step, the plain loader's chunk and arithmetic. The caller synchronizes the owners before and after.
template <int HD, int KEYS, int NT>
__device__ __forceinline__ void fp8_tile_dequant(const unsigned char* stage, bf16* kd, bf16* vd, int tid) {
  namespace L = kv_fp8_tile;
  constexpr int R = mma_tile::row_stride<HD>();
#pragma unroll
  for (int c = tid; c < L::dequant_chunks(HD, KEYS); c += NT) {
    const L::Chunk ch = L::dequant_chunk(HD, c);
    const uint2 kr = *reinterpret_cast<const uint2*>(stage + L::k_code_at(HD, ch.row, ch.col));
    const uint2 vr = *reinterpret_cast<const uint2*>(stage + L::v_code_at(HD, KEYS, ch.row, ch.col));
    const float ks = *reinterpret_cast<const float*>(stage + L::k_scale_at(HD, KEYS, ch.row));
    const float vs = *reinterpret_cast<const float*>(stage + L::v_scale_at(HD, KEYS, ch.row));
    *reinterpret_cast<uint4*>(kd + ch.row * R + ch.col) = fp8x8_to_bf16(kr, ks);
    *reinterpret_cast<uint4*>(vd + ch.row * R + ch.col) = fp8x8_to_bf16(vr, vs);
  }
}

// Host: calls f(std::integral_constant<KvLoad, L>{}) with the loader of the params' cache: kBf16 without FP8
// scales, else kFp8Async, or kFp8Plain where fp8_kv_plain_loads() (MXSERVE_FP8_KV_PLAIN_LOADS=1) asks for it.
template <class F>
void dispatch_kv_load(const AttentionParams& p, F&& f) {
  if (!p.fp8_kv())
    f(std::integral_constant<KvLoad, KvLoad::kBf16>{});
  else if (fp8_kv_plain_loads())
    f(std::integral_constant<KvLoad, KvLoad::kFp8Plain>{});
  else
    f(std::integral_constant<KvLoad, KvLoad::kFp8Async>{});
}

}  // namespace mxserve::kernels::cuda
