// FP8 latent cache rows of glm_moe_dsa (--kv-cache-dtype fp8_e4m3), shared by the CPU reference and the CUDA
// write / read kernels (one source, so both backends store the same bytes).
// Layout ("packed FP8 row", the production engines' per-token layout): a cache tensor of DType::kU8
// [n_slots, row_bytes], one row per token slot:
//   bytes [0, n)                         n e4m3 codes of the quantized part
//   bytes [n, n + 4 ceil(n / 128))       one f32 scale per block of 128 codes (the last block may be shorter)
//   bytes [tail_offset, + 2 tail)        the unquantized tail, bf16
// MLA latent: n = kv_lora_rank (the nope latent), tail = qk_rope_dim (the roped key). At GLM-5.x's 512 / 64
// this is FlashMLA's / vLLM's "fp8_ds_mla" row for DeepSeek-V3.2: 512 codes, 4 f32 scales, 64 bf16 = 656
// bytes (vs 1152 bf16), the rope kept in bf16 because RoPE'd keys carry outliers that e4m3 would crush.
// DSA indexer key: n = index_head_dim, no tail: 128 codes + 1 f32 scale = 132 bytes, the bytes per token of
// DeepGEMM's fp8_paged_mqa_logits cache. DeepGEMM puts a page's scales after the page's codes; here they
// stay in the token's row, because this cache's invariant is that a slot is one row (tree compaction and
// the host KV tier copy rows / blocks of rows by role without knowing a layout).
// Scales: dynamic, s = amax / 448 per block (kernels/kv_fp8.h: exact f32 arithmetic, RNE, saturating), so the
// host and device write bit-identical codes and scales from the same input values. Dequantized element =
// e4m3_value(code) * s: relative error <= 2^-4 of the element (half a unit of the 3-bit mantissa) above
// 2^-6 s, absolute <= 2^-10 s below (subnormals).
// Writes: cache_write(rows, meta, cache, col_offset) on a kU8 cache quantizes rows into the codes + scales
// when col_offset == 0 (the whole quantized part in one write) and stores them as the bf16 tail when
// col_offset > 0 (col_offset is then n, the quantized width: the tail starts at tail_offset(n)).
#pragma once

#include <cstdint>

#include "kernels/kv_fp8.h"

namespace mxserve::kernels {

constexpr int kMlaFp8Block = 128;  // codes per f32 scale

MX_KV_FP8_HD constexpr int64_t mla_fp8_n_scales(int64_t n) { return (n + kMlaFp8Block - 1) / kMlaFp8Block; }
// Byte offset of the bf16 tail (= bytes of codes + scales) for a quantized part of n values.
MX_KV_FP8_HD constexpr int64_t mla_fp8_tail_offset(int64_t n) { return n + 4 * mla_fp8_n_scales(n); }
// Bytes of one packed row: n codes, their scales, `tail` bf16.
MX_KV_FP8_HD constexpr int64_t mla_fp8_row_bytes(int64_t n, int64_t tail) { return mla_fp8_tail_offset(n) + 2 * tail; }
// Whether (n, tail) can be packed with aligned f32 scales and bf16 tail (rows a multiple of 4 bytes).
MX_KV_FP8_HD constexpr bool mla_fp8_shape_ok(int64_t n, int64_t tail) { return n > 0 && n % 4 == 0 && tail >= 0 && tail % 2 == 0; }

// Where the device readers find 16-byte output chunk c (8 values) of a packed row of n quantized values
// (n % 8 == 0): chunks [0, n / 8) are 8 codes at byte 8c with the f32 scale at byte `scale`; later chunks are
// 8 bf16 tail values copied from byte `bytes` (16-byte aligned when the tail offset is: 528 at 512 / 64).
// One source for the CUDA loads (kernels/cuda/attention/mla_fp8_load.cuh) and their host emulation test.
struct MlaFp8Chunk {
  int64_t bytes = 0;   // first byte of the chunk's codes (8) or bf16 tail values (16)
  int64_t scale = -1;  // byte of the codes' f32 scale; -1 for a tail chunk
};
MX_KV_FP8_HD constexpr MlaFp8Chunk mla_fp8_chunk(int64_t n, int64_t c) {
  return 8 * c < n ? MlaFp8Chunk{8 * c, n + 4 * ((8 * c) / kMlaFp8Block)}
                   : MlaFp8Chunk{mla_fp8_tail_offset(n) + 16 * (c - n / 8), -1};
}

}  // namespace mxserve::kernels
