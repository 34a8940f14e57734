// The fused RoPE + K/V cache write (kernels/cuda/rope_kv_write.cu) and the CUDA backend's rope_kv_write op (label
// gpu; skips without a CUDA device), against the ops GQA attention ran before -- q, k, v as separate bf16 tensors,
// rope(q), rope(k), kv_write on the CUDA backend -- BIT FOR BIT: q, the cache rows (bf16, or FP8 E4M3 codes) and the
// FP8 scales. Both the kernel's launcher and the backend op are checked: the op runs whichever path
// MXSERVE_FUSED_ROPE_KV / kFusedRopeKvDefault choose (the log says which), so run this binary once as is and once
// with MXSERVE_FUSED_ROPE_KV=1 (and =0). Then the CPU reference backend (f32 rope, f32 / FP8 cache) within bf16
// tolerance: q and bf16 K within kTolBf16 (one bf16 rounding of each roped value, 2^-9 relative at most), V codes and
// scales byte for byte (V is not roped: the same bf16 inputs on both), K dequantized within kTolFp8K (see there).
// Shapes: GLM-4.5-Air's attention (96 q / 8 kv heads x 128, rotary_dim 64), a tiny one, full rotary, T in
// {1, 3, 16, 130}, shuffled slots, and at T >= 3 token 1 a padding row (slot -1): q roped, nothing written -- every
// cache row outside the written slots keeps its starting bytes on every path (kv_write's padding-row rule).
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/numeric.h"
#include "gpu_oracle.h"
#include "kernels/cuda/rope_kv_write.h"

namespace mxserve {
namespace {

constexpr double kTolBf16 = 3e-3;
// A K element whose bf16 rounding (GPU) vs f32 (CPU) crosses an e4m3 rounding boundary moves one code step (2^-3
// relative), ~1.5% of elements, plus the head scale from a bf16 vs f32 amax: rel L2 ~1.3e-2 on 128-wide heads, up to
// ~4.6e-2 on the tiny shape's 32 K values of one token (host simulation, 3000 draws). A wrong row, head or an
// unroped K is O(1).
constexpr double kTolFp8K = 8e-2;

using gpu_oracle::expect_bytes_equal;

struct Geometry {
  int hq, hkv, hd, rd;
};

class CudaRopeKvWrite : public gpu_oracle::CudaVsCpuTest {
 protected:
  CudaRopeKvWrite() : CudaVsCpuTest(20261206) {}

  static Tensor columns(const Tensor& y, int64_t b, int64_t e) {
    const int64_t T = y.dim(0), N = y.dim(1);
    Tensor c = Tensor::empty(DType::kF32, {T, e - b});
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(c.data<float>() + t * (e - b), y.data<float>() + t * N + b, sizeof(float) * (e - b));
    return c;
  }
  // Rows `rows` of a host [n_slots, W] tensor of 4-byte (f32) or 1-byte (FP8) elements, as f32 values.
  static std::vector<double> rows_of(const Tensor& t, const std::vector<int32_t>& rows, const Tensor* scales, int hd) {
    const int64_t W = t.dim(1);
    std::vector<double> out;
    for (int32_t r : rows)
      for (int64_t c = 0; c < W; ++c) {
        if (t.dtype() == DType::kF32) {
          out.push_back(t.data<float>()[r * W + c]);
        } else {
          const float s = scales->data<float>()[r * (W / hd) + c / hd];
          out.push_back(double{fp8_e4m3_to_f32(static_cast<const uint8_t*>(t.raw())[r * W + c])} * s);
        }
      }
    return out;
  }

  void run_case(const Geometry& g, int64_t T, bool fp8) {
    SCOPED_TRACE(testing::Message() << g.hq << "/" << g.hkv << " heads x " << g.hd << " rotary " << g.rd << " T " << T
                                    << (fp8 ? " fp8" : " bf16"));
    const int64_t nq = int64_t{g.hq} * g.hd, nkv = int64_t{g.hkv} * g.hd, n_slots = 2 * T + 9;
    const Tensor y = rand({T, nq + 2 * nkv}, 2.f);
    Tensor pos = Tensor::empty(DType::kI32, {T});
    std::vector<int32_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    std::vector<int32_t> slots(all.begin(), all.begin() + T);
    if (T >= 3) slots[1] = -1;  // a padding row
    std::vector<int32_t> written;
    for (int32_t s : slots)
      if (s >= 0) written.push_back(s);
    std::uniform_int_distribution<int> pd(0, 131071);
    for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = t == 0 ? 0 : pd(rng_);
    const Tensor slot_host = Tensor::view_of(const_cast<int32_t*>(slots.data()), DType::kI32, {T});
    kernels::RopeParams rp;
    rp.n_heads = g.hq;
    rp.head_dim = g.hd;
    rp.rotary_dim = g.rd;
    rp.theta = 1e6f;

    // The caches' starting contents, the same on every path (written rows must change; the rest must not).
    Tensor k0, v0;
    if (fp8) {
      k0 = Tensor::empty(DType::kFP8E4M3, {n_slots, nkv});
      v0 = Tensor::empty(DType::kFP8E4M3, {n_slots, nkv});
      for (Tensor* t : {&k0, &v0})
        for (int64_t i = 0; i < t->numel(); ++i) static_cast<uint8_t*>(t->raw())[i] = static_cast<uint8_t>(rng_() % 0x7e);
    } else {
      k0 = rand({n_slots, nkv}, 1.f);
      v0 = rand({n_slots, nkv}, 1.f);
    }
    const Tensor ks0 = rand({n_slots, g.hkv}, 1.f), vs0 = rand({n_slots, g.hkv}, 1.f);
    struct Dev {
      Tensor kc, vc, ks, vs;
      backend::AttentionMeta meta;
    };
    auto make_dev = [&]() {
      Dev d;
      d.kc = fp8 ? gpu_->upload(k0) : gpu_bf16(k0);
      d.vc = fp8 ? gpu_->upload(v0) : gpu_bf16(v0);
      d.ks = gpu_->upload(ks0);
      d.vs = gpu_->upload(vs0);
      d.meta.slot_mapping = gpu_->upload(slot_host);
      d.meta.params.n_heads = g.hq;
      d.meta.params.n_kv_heads = g.hkv;
      d.meta.params.head_dim = g.hd;
      if (fp8) {
        d.meta.params.k_scales = d.ks.data<float>();
        d.meta.params.v_scales = d.vs.data<float>();
      }
      return d;
    };
    const Tensor gpos = gpu_->upload(pos);

    // 1. The reference: the separate ops on the CUDA backend.
    Dev ref = make_dev();
    Tensor q_ref = gpu_bf16(columns(y, 0, nq));
    {
      Tensor k = gpu_bf16(columns(y, nq, nq + nkv)), v = gpu_bf16(columns(y, nq + nkv, nq + 2 * nkv));
      gpu_->rope(q_ref, gpos, rp);
      kernels::RopeParams pk = rp;
      pk.n_heads = g.hkv;
      gpu_->rope(k, gpos, pk);
      gpu_->kv_write(k, v, ref.meta, ref.kc, ref.vc);
    }
    // 2. The kernel's launcher (on the legacy stream, the backend's work fenced on both sides).
    Dev ker = make_dev();
    Tensor q_ker = poison_bf16({T, nq});
    {
      Tensor yd = gpu_bf16(y);
      gpu_->synchronize();
      kernels::cuda::rope_kv_write_bf16(yd.raw(), gpos.data<int32_t>(), T, rp, g.hkv,
                                        ker.meta.slot_mapping.data<int32_t>(), q_ker.raw(), ker.kc.raw(), ker.vc.raw(),
                                        ker.meta.params.k_scales, ker.meta.params.v_scales, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    // 3. The backend op (whichever path the switch picked).
    Dev op = make_dev();
    Tensor yo = gpu_bf16(y);
    const Tensor q_op = gpu_->rope_kv_write(yo, gpos, rp, op.meta, op.kc, op.vc);
    ASSERT_EQ(q_op.numel(), T * nq);

    const Tensor hq_ref = host(q_ref), hk_ref = host(ref.kc), hv_ref = host(ref.vc);
    for (int which = 0; which < 2; ++which) {
      const char* name = which == 0 ? "kernel" : "op";
      const Dev& d = which == 0 ? ker : op;
      expect_bytes_equal(host(which == 0 ? q_ker : q_op), hq_ref, (std::string(name) + " q").c_str());
      expect_bytes_equal(host(d.kc), hk_ref, (std::string(name) + " k_cache").c_str());
      expect_bytes_equal(host(d.vc), hv_ref, (std::string(name) + " v_cache").c_str());
      if (fp8) {
        expect_bytes_equal(host(d.ks), host(ref.ks), (std::string(name) + " k_scales").c_str());
        expect_bytes_equal(host(d.vs), host(ref.vs), (std::string(name) + " v_scales").c_str());
      }
    }
    // Every written K row changed (the reference did the work).
    const Tensor hk0 = fp8 ? k0 : host(gpu_bf16(k0));
    const int64_t row_bytes = static_cast<int64_t>(hk_ref.nbytes()) / n_slots;
    for (int64_t t = 0; t < T; ++t)
      if (slots[t] >= 0)
        EXPECT_NE(std::memcmp(static_cast<const uint8_t*>(hk_ref.raw()) + slots[t] * row_bytes,
                              static_cast<const uint8_t*>(hk0.raw()) + slots[t] * row_bytes, row_bytes),
                  0)
            << "k row of token " << t << " unwritten by the reference";
    // Every other row (the padding row's included: it has none) keeps its starting bytes.
    const Tensor hv0 = fp8 ? v0 : host(gpu_bf16(v0));
    for (int64_t r = 0; r < n_slots; ++r) {
      if (std::find(written.begin(), written.end(), r) != written.end()) continue;
      for (int which = 0; which < 2; ++which)
        EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>((which ? hv_ref : hk_ref).raw()) + r * row_bytes,
                              static_cast<const uint8_t*>((which ? hv0 : hk0).raw()) + r * row_bytes, row_bytes),
                  0)
            << (which ? "v" : "k") << " row " << r << " was written though no token maps to it";
    }

    // 4. The CPU reference backend (f32 rope; f32 or FP8 cache) within bf16 tolerance.
    Tensor cpu_k = Tensor::empty(k0.dtype(), k0.shape()), cpu_v = Tensor::empty(v0.dtype(), v0.shape());
    std::memcpy(cpu_k.raw(), k0.raw(), k0.nbytes());
    std::memcpy(cpu_v.raw(), v0.raw(), v0.nbytes());
    Tensor cpu_ks = Tensor::empty(DType::kF32, ks0.shape()), cpu_vs = Tensor::empty(DType::kF32, vs0.shape());
    std::memcpy(cpu_ks.raw(), ks0.raw(), ks0.nbytes());
    std::memcpy(cpu_vs.raw(), vs0.raw(), vs0.nbytes());
    backend::AttentionMeta cm;
    cm.slot_mapping = slot_host;
    cm.params = ref.meta.params;
    cm.params.k_scales = fp8 ? cpu_ks.data<float>() : nullptr;
    cm.params.v_scales = fp8 ? cpu_vs.data<float>() : nullptr;
    Tensor cy = Tensor::empty(DType::kF32, y.shape());
    std::memcpy(cy.raw(), y.raw(), y.nbytes());
    const Tensor cq = cpu_->rope_kv_write(cy, pos, rp, cm, cpu_k, cpu_v);
    Tensor cq_c = Tensor::empty(DType::kF32, {T, nq});
    std::memcpy(cq_c.raw(), cq.raw(), cq_c.nbytes());
    gpu_oracle::expect_within(gpu_oracle::compare(hq_ref, cq_c), kTolBf16, "rope_kv_write q vs cpu");
    const Tensor hks = host(ref.ks);
    if (!fp8) {
      gpu_oracle::expect_within(gpu_oracle::compare(rows_of(hk_ref, written, nullptr, g.hd), rows_of(cpu_k, written, nullptr, g.hd)),
                                kTolBf16, "rope_kv_write k vs cpu");
      gpu_oracle::expect_within(gpu_oracle::compare(rows_of(hv_ref, written, nullptr, g.hd), rows_of(cpu_v, written, nullptr, g.hd)),
                                0.0, "rope_kv_write v vs cpu");
    } else {
      gpu_oracle::expect_within(gpu_oracle::compare(rows_of(hk_ref, written, &hks, g.hd), rows_of(cpu_k, written, &cpu_ks, g.hd)),
                                kTolFp8K, "rope_kv_write k fp8 vs cpu");
      expect_bytes_equal(hv_ref, cpu_v, "v codes vs cpu");
      expect_bytes_equal(host(ref.vs), cpu_vs, "v scales vs cpu");
    }
  }
};

TEST_F(CudaRopeKvWrite, GlmAirShapeBitForBit) {
  for (int64_t T : {1, 3, 16, 130})
    for (bool fp8 : {false, true}) run_case({96, 8, 128, 64}, T, fp8);
}

TEST_F(CudaRopeKvWrite, SmallShapesBitForBit) {
  for (const Geometry& g : {Geometry{4, 2, 16, 8}, Geometry{8, 1, 64, 64}, Geometry{6, 2, 32, 16}})
    for (int64_t T : {1, 3, 16, 130})
      for (bool fp8 : {false, true}) run_case(g, T, fp8);
}

}  // namespace
}  // namespace mxserve
