// Design 8 of the MXFP4 expert GEMMs (prefill, Hopper warpgroup MMA, W4A8): design 6 (moe_mxfp4_wg.cu) with
// FP8 e4m3 operands on both sides, opt-in through MoeShape::fp8_activations (moe_mxfp4.cu swaps a plan's
// wg_* variant for the wg8_* one moe_mxfp4_w4a8_variant picks by rows per expert). Variants wg8_n{BN}_s{S}: rows of moe_mxfp4_variants.h.
// Number formats (kernels/w4a8_fp8.h, shared with the CPU oracle of the tests):
//   A (tokens) u8 e4m3 [rows, K] + f32 scale per row, written by w4a8_quantize_rows_kernel below: x [T, H] for
//     gate_up (gathered through row_token), the SwiGLU intermediate act [P, I] (permuted rows) for down;
//   B (weights) E2M1 codes converted to e4m3 in shared memory with the E8M0 block scale folded in exactly:
//     block b of weight row n as e2m1 * 2^(6 - (r_n - s_b)), r_n = max_b s_b of the row (computed at block
//     start from the row's K / 32 scale bytes), and the epilogue multiplies column n by 2^(r_n - 133) and
//     row m by the token scale. Exact for r_n - s_b <= 11 (a byte-permute table); beyond, a slow per-element
//     path rounds the tiny magnitudes to e4m3 subnormals / zero (w4a8_weight_code; the CPU oracle does too).
// Block tile: BM (P2: 128, or 256 with BN 128) rows of one expert (wgmma M) x BN weight rows (N; gate_up:
// gate and up rows interleaved in groups of 8 as in design 6) x 128 K per step (one 128-byte swizzle row of
// fp8 = 4 wgmma k32). 256 threads = 2 warpgroups, warpgroup w owning tile rows [BM/2 w, BM/2 (w + 1)), one
// m64nBNk32 f32 accumulator per 64 of them; BM 256 converts each weight tile once per 256 rows, not 128.
// Pipeline exactly as design 6: an S-stage cp.async ring (tokens 128 x 128 B straight into the 128-byte
// swizzle layout, codes BN x 64 B, the step's 4 E8M0 bytes per row), two converted B tiles; step ks issues
// its wgmmas, waits for step ks - 1, refills the freed slot and converts stage ks + 1 while ks runs. Every
// generic-proxy shared write a wgmma reads (cp.async tokens, converted weights) is fenced by its writer
// (fence.proxy.async) before the barrier that precedes the wgmma. The weight-row map and the load stage are the
// tile walker shared with design 6 (moe_mxfp4_wg_tile.cuh).
// Requires sm_90a and K % 128 == 0; the dispatcher (moe_mxfp4.cu) runs the bf16 design-6 counterpart
// elsewhere (saying so once), so the launcher treats anything else as a caller bug.

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "core/logging.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/sm90_device.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_wg_tile.cuh"
#include "kernels/w4a8_fp8.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kWg8BK = 128;  // K per step (one 128-byte swizzle row of e4m3)
constexpr int kWg8Threads = 256;

template <int kBN, int kStages, int kBM>
struct Wg8Layout {  // byte offsets from the 1024-aligned base of dynamic shared memory
  static constexpr int kBTile = kBN * 128;  // one converted e4m3 B tile
  static constexpr int kATile = kBM * 128;
  static constexpr int kCodes = kBN * 64;  // 128 E2M1 codes per row
  static constexpr int kScales = kBN * 4;  // 4 E8M0 bytes per row
  static constexpr int kB0 = 0;
  static constexpr int kA0 = 2 * kBTile;
  static constexpr int kCodes0 = kA0 + kStages * kATile;
  static constexpr int kScales0 = kCodes0 + kStages * kCodes;
  static constexpr int kRef0 = kScales0 + kStages * kScales;  // int [BN]: reference exponent r of each row
  static constexpr int kFac0 = kRef0 + kBN * 4;               // f32 [BN]: 2^(r - 133) (0 for rows past N)
  static constexpr int kBytes = kFac0 + kBN * 4;
  static constexpr size_t kSmem = kBytes + 1024;  // + alignment slack
};

// Rare exact path (d > 11): element by element through the shared encoder.
__device__ __noinline__ W4a8Pair e2m1x8_to_e4m3_slow(uint32_t w, int d) {
  uint32_t out[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i / 4] |= static_cast<uint32_t>(w4a8_weight_code((w >> (4 * i)) & 15u, d)) << (8 * (i % 4));
  return {out[0], out[1]};
}

// kBM: expert rows per tile, 128 or 256 (each warpgroup then owns kBM / 2 rows = kMt m64 row blocks, one
// accumulator each; 256 halves the weight conversion per flop).
template <int kBN, int kStages, int kBM, bool kSwiglu>
__global__ void __launch_bounds__(kWg8Threads, kBN == 128 && kBM == 128 ? 2 : 1) mxfp4_wg8_kernel(Mxfp4GemmArgs p) {
  using L = Wg8Layout<kBN, kStages, kBM>;
  constexpr int kMt = kBM / 128;       // m64 row blocks per warpgroup
  constexpr int kARows = kBM / 32;     // A-tile 16-byte chunks per thread per stage
  constexpr int kAcc = kBN / 2;        // accumulator registers per thread per row block
  using Weights = WgWeightSources<kBN, kWg8BK, kWg8Threads, kSwiglu>;
  constexpr int kCodeUnits = Weights::kCodeUnits;  // 16-byte code units (= one 32-element E8M0 block) per thread
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wq = warp % 4;
  mxfp4_pdl_wait();

  const int n_act = *p.n_active;
  const int e = p.active[min(static_cast<int>(blockIdx.y), p.max_active - 1)];
  if (static_cast<int>(blockIdx.y) >= n_act) return;
  const int K = p.k, N = p.n, n_steps = K / kWg8BK;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int fbase = blockIdx.x * (kSwiglu ? kBN / 2 : kBN);
  const int rb = p.row_offsets[e], rows_total = p.row_offsets[e + 1] - rb;
  int* sref = reinterpret_cast<int*>(smem + L::kRef0);
  float* sfac = reinterpret_cast<float*>(smem + L::kFac0);

  // Reference exponent of each B row: the max of its K / 32 scale bytes (K / 128 aligned words).
  for (int row = tid; row < kBN; row += kWg8Threads) {
    bool ok;
    const int64_t gr = wg_weight_row<kSwiglu>(row, e, N, w_rows, fbase, ok);
    int r = 0;
    if (ok) {
      const uint32_t* sp = reinterpret_cast<const uint32_t*>(p.ws + gr * (K / 32));
      uint32_t mx = 0;  // bytewise max of the words; unrolled so 8 loads are in flight (once per block)
#pragma unroll 8
      for (int i = 0; i < K / 128; ++i) mx = __vmaxu4(mx, __ldg(sp + i));
      r = max(max(mx & 0xFF, (mx >> 8) & 0xFF), max((mx >> 16) & 0xFF, mx >> 24));
    }
    sref[row] = r;
    sfac[row] = ok ? w4a8_row_factor(r) : 0.f;
  }

  // Code unit u = tid + 256 i -> row u / 4, 32-element block u % 4; scale word of row tid (+ 256 i).
  const Weights wsrc(p, e, K, N, w_rows, fbase, tid);

  for (int r0 = 0; r0 < rows_total; r0 += kBM) {
    const int rows = min(kBM, rows_total - r0);
    // Row tid / 8 + 32 i, 16-byte chunk tid % 8.
    const WgTokenSources<kARows, kWg8BK, uint8_t, kSwiglu> asrc(p, K, rb, r0, rows, tid);
    auto load_stage = [&](int ks, int slot) {
      asrc.template load<L::kA0, L::kATile>(smem, slot, ks, p, tid);
      wsrc.template load<L::kCodes0, L::kCodes, L::kScales0, L::kScales>(smem, slot, ks, p, tid);
    };
    // Convert stage ks (ring slot) into B tile `buf`: unit u -> row u / 4, block u % 4 = 16-byte chunks 2 (u % 4)
    // and 2 (u % 4) + 1 of the row.
    auto convert = [&](int slot, int buf) {
#pragma unroll
      for (int i = 0; i < kCodeUnits; ++i) {
        const int u = tid + kWg8Threads * i, row = u / 4, blk = u % 4;
        const uint4 q = *reinterpret_cast<const uint4*>(smem + L::kCodes0 + slot * L::kCodes + u * 16);
        const int d = sref[row] - static_cast<int>(smem[L::kScales0 + slot * L::kScales + row * 4 + blk]);
        W4a8Pair c0, c1, c2, c3;
        if (d <= kW4a8ExactMaxD) {
          const W4a8Table tb = w4a8_table(d);
          c0 = w4a8_convert8(q.x, tb);
          c1 = w4a8_convert8(q.y, tb);
          c2 = w4a8_convert8(q.z, tb);
          c3 = w4a8_convert8(q.w, tb);
        } else {
          c0 = e2m1x8_to_e4m3_slow(q.x, d);
          c1 = e2m1x8_to_e4m3_slow(q.y, d);
          c2 = e2m1x8_to_e4m3_slow(q.z, d);
          c3 = e2m1x8_to_e4m3_slow(q.w, d);
        }
        unsigned char* bt = smem + L::kB0 + buf * L::kBTile;
        *reinterpret_cast<uint4*>(bt + wg_swz128(row, 2 * blk)) = make_uint4(c0.x, c0.y, c1.x, c1.y);
        *reinterpret_cast<uint4*>(bt + wg_swz128(row, 2 * blk + 1)) = make_uint4(c2.x, c2.y, c3.x, c3.y);
      }
    };

    __syncthreads();  // the previous tile's wgmmas and conversion reads are done (and sref / sfac written)
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_steps) load_stage(s, s);
      cp_async_commit_group();
    }
    float acc[kMt][kAcc];
#pragma unroll
    for (int m = 0; m < kMt; ++m)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[m][i] = 0.f;
    cp_async_wait_group<kStages - 2>();  // stage 0 landed (this thread's part)
    __syncthreads();
    convert(0, 0);
    wgmma::fence_proxy_async_smem();
    __syncthreads();

    for (int ks = 0; ks < n_steps; ++ks) {
      // Warpgroup wg's row block m: tile rows (kMt wg + m) * 64 .. + 63.
      const uint32_t a_addr = sbase + L::kA0 + (ks % kStages) * L::kATile + wg * kMt * 64 * 128;
      const uint32_t b_addr = sbase + L::kB0 + (ks % 2) * L::kBTile;
#pragma unroll
      for (int m = 0; m < kMt; ++m) wgmma::fence_regs(acc[m]);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kWg8BK / 32; ++kk) {
        const uint64_t db = wgmma::desc_sw128_kmajor(b_addr + 32 * kk);
#pragma unroll
        for (int m = 0; m < kMt; ++m) {
          const uint64_t da = wgmma::desc_sw128_kmajor(a_addr + m * 64 * 128 + 32 * kk);
          if constexpr (kBN == 128) wgmma::m64n128k32_e4m3_ss(acc[m], da, db, 1);
          else wgmma::m64n256k32_e4m3_ss(acc[m], da, db, 1);
        }
      }
      wgmma::commit_group();
#pragma unroll
      for (int m = 0; m < kMt; ++m) wgmma::fence_regs(acc[m]);
      wgmma::wait_group<1>();  // this warpgroup's step ks - 1 is done
#pragma unroll
      for (int m = 0; m < kMt; ++m) wgmma::fence_regs(acc[m]);
      if (ks + 1 < n_steps) {
        cp_async_wait_group<kStages - 3>();  // stage ks + 1 landed
        wgmma::fence_proxy_async_smem();
      }
      __syncthreads();  // every warpgroup's step ks - 1 done; stage ks + 1 visible to all threads
      if (ks + kStages - 1 < n_steps) load_stage(ks + kStages - 1, (ks + kStages - 1) % kStages);
      cp_async_commit_group();
      if (ks + 1 < n_steps) {
        convert((ks + 1) % kStages, (ks + 1) % 2);
        wgmma::fence_proxy_async_smem();
      }
      __syncthreads();  // B tile of step ks + 1 complete and fenced
    }
    wgmma::wait_group<0>();
#pragma unroll
    for (int m = 0; m < kMt; ++m) wgmma::fence_regs(acc[m]);
    cp_async_wait_group<0>();

    // Epilogue: row = 64 (kMt wg + m) + 16 wq + g + 8 h, accumulator column 8 j + 2 t (+1) = B-tile row;
    // value = acc * token scale(row) * 2^(r_col - 133).
#pragma unroll
    for (int mh = 0; mh < 2 * kMt; ++mh) {
      const int m = mh / 2, h = mh % 2;
      const int row = (wg * kMt + m) * 64 + wq * 16 + g + 8 * h;
      if (row >= rows) continue;
      const int64_t src_row = kSwiglu ? static_cast<int64_t>(p.row_token[rb + r0 + row]) : rb + r0 + row;
      const float as = p.a_scale[src_row];
      bf16* crow = p.c + static_cast<int64_t>(rb + r0 + row) * N;
      if constexpr (kSwiglu) {
#pragma unroll
        for (int jp = 0; jp < kBN / 16; ++jp) {
          const int feat = fbase + jp * 8 + 2 * t;
          if (feat >= N) continue;
          const int cg = 16 * jp + 2 * t, cu = cg + 8;
          const float g0 = acc[m][4 * (2 * jp) + 2 * h] * as * sfac[cg];
          const float g1 = acc[m][4 * (2 * jp) + 2 * h + 1] * as * sfac[cg + 1];
          const float u0 = acc[m][4 * (2 * jp + 1) + 2 * h] * as * sfac[cu];
          const float u1 = acc[m][4 * (2 * jp + 1) + 2 * h + 1] * as * sfac[cu + 1];
          const __nv_bfloat162 v = __floats2bfloat162_rn(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
          *reinterpret_cast<__nv_bfloat162*>(crow + feat) = v;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
          const int feat = fbase + j * 8 + 2 * t;
          if (feat >= N) continue;
          *reinterpret_cast<__nv_bfloat162*>(crow + feat) = __floats2bfloat162_rn(
              acc[m][4 * j + 2 * h] * as * sfac[8 * j + 2 * t], acc[m][4 * j + 2 * h + 1] * as * sfac[8 * j + 2 * t + 1]);
        }
      }
    }
  }
}

// Per-row FP8 quantization of a bf16 matrix [rows, cols] (cols % 8 == 0): one warp per row, amax then codes
// (w4a8_act_scale / w4a8_act_code, bit-identical to the CPU oracle). 8 rows per 256-thread block.
__global__ void __launch_bounds__(256) w4a8_quantize_rows_kernel(const bf16* __restrict__ x, int64_t rows, int cols,
                                                                 uint8_t* __restrict__ q, float* __restrict__ scale) {
  mxfp4_pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (row >= rows) return;
  const bf16* xr = x + row * cols;
  float amax = 0.f;
  for (int c = 8 * lane; c < cols; c += 256) {
    const uint4 v = *reinterpret_cast<const uint4*>(xr + c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = w4a8_act_scale(amax);
  uint8_t* qr = q + row * cols;
  for (int c = 8 * lane; c < cols; c += 256) {
    const uint4 v = *reinterpret_cast<const uint4*>(xr + c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t out[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      out[i / 2] |= (static_cast<uint32_t>(w4a8_act_code(f.x, s)) | (static_cast<uint32_t>(w4a8_act_code(f.y, s)) << 8))
                    << (16 * (i % 2));
    }
    *reinterpret_cast<uint2*>(qr + c) = make_uint2(out[0], out[1]);
  }
  if (lane == 0) scale[row] = s;
}

template <int kBN, int kStages, int kBM, bool kSwiglu>
void launch_wg8(const Mxfp4GemmArgs& a, cudaStream_t stream) {
  MX_CHECK_MSG(mxfp4_wg8_device_ok() && a.k % 128 == 0,
               "wg8_* (W4A8) MXFP4 variants need an sm_90 device and K % 128 == 0 (K " << a.k
                                                                                      << "): the dispatcher should "
                                                                                         "have run the bf16 design 6");
  MX_CHECK_MSG(a.a8 != nullptr && a.a_scale != nullptr,
               "wg8_* (W4A8) MXFP4 variants need the FP8 activations (Mxfp4GemmArgs::a8 / a_scale)");
  MX_CHECK_MSG(reinterpret_cast<uintptr_t>(a.ws) % 4 == 0 && reinterpret_cast<uintptr_t>(a.wq) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.a8) % 16 == 0 && reinterpret_cast<uintptr_t>(a.c) % 4 == 0,
               "wg8_* MXFP4 variants need 16-byte aligned codes and activations, 4-byte aligned scales and output");
  using L = Wg8Layout<kBN, kStages, kBM>;
  auto* kernel = mxfp4_wg8_kernel<kBN, kStages, kBM, kSwiglu>;
  MX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::kSmem)));
  const dim3 grid(ceil_div(a.n, kSwiglu ? kBN / 2 : kBN), a.max_active);
  mxfp4_launch_pdl(kernel, grid, dim3(kWg8Threads), L::kSmem, stream, a);
}

template <int kBN, int kStages, int kP2>
struct Wg8Launch {
  static constexpr int kBM = kP2 == 0 ? 128 : kP2;  // P2: expert rows per tile (0: 128)
  static_assert(kBN == 128 || kBN == 256, "wg8_*: BN is 128 or 256");
  static_assert(kBM == 128 || (kBM == 256 && kBN == 128), "wg8_*: BM is 128, or 256 with BN 128 (registers)");
  static_assert(kStages >= 3, "wg8_*: the k loop keeps one stage in flight beyond the next (S >= 3)");
  static_assert(Wg8Layout<kBN, kStages, kBM>::kSmem <= 227 * 1024, "wg8_*: shared memory over 227 KiB");
  static void run(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
    if (swiglu) launch_wg8<kBN, kStages, kBM, true>(a, stream);
    else launch_wg8<kBN, kStages, kBM, false>(a, stream);
  }
};

}  // namespace

bool mxfp4_wg8_device_ok() { return cuda_device_is_sm90(); }

void mxfp4_w4a8_quantize_rows(const bf16* x, int64_t rows, int cols, uint8_t* q, float* scale, cudaStream_t stream) {
  MX_CHECK_MSG(cols % 8 == 0, "mxfp4_w4a8_quantize_rows: cols " << cols << " must be a multiple of 8");
  if (rows == 0) return;
  mxfp4_launch_pdl(w4a8_quantize_rows_kernel, dim3(ceil_div(rows, 8)), dim3(256), 0, stream, x, rows, cols, q, scale);
}

const Mxfp4Launchers& mxfp4_wg8_launchers() {
  static constexpr Mxfp4Launchers kLaunchers = mxfp4_design_launchers<MoeMxfp4Design::kWg8, Wg8Launch>();
  return kLaunchers;
}

}  // namespace mxserve::kernels::cuda
