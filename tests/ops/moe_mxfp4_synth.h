// Synthetic MXFP4 MoE problems at real model sizes for the wg_* (Hopper wgmma) checks and benchmark
// (test_cuda_moe_mxfp4_wg, bench_moe_mxfp4_wg): packed weights of every expert generated on the host with a
// fast PRNG and uploaded once, routings with distinct experts per token (optionally restricted to a pool or
// forcing one hot expert), and a per-token host reference decoded straight from the packed codes (double
// accumulation; act rounded to bf16 as the GPU does), so a large-M run is checked on sampled tokens without
// dequantizing whole expert tensors. Layouts: kernels/cuda/moe_mxfp4/moe_mxfp4.h.
// W4A8 oracle (design 8, MoeShape::fp8_activations): W4a8Ref turns on, per GEMM, the same per-row e4m3
// quantization of the GEMM's A operand (x per token, the bf16 intermediate per (token, slot) row) and the
// same weight conversion (row reference exponent, e4m3 rounding past distance 11) as the GPU, through the
// shared kernels/w4a8_fp8.h, so the GPU must match it to fp32-accumulation noise.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/numeric.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "kernels/w4a8_fp8.h"

namespace mxserve::moe_synth {

struct Shape {
  const char* name;
  int64_t H, I;
  int E, K;
};
// The two MoE shapes the checks and benchmarks run (d_model H, expert inter I, E experts, top K).
constexpr Shape kGlmAir{"GLM-4.5-Air", 4096, 1408, 128, 8};
constexpr Shape kGlm52{"GLM-5.2", 6144, 2048, 256, 8};

// Packed E2M1 codes (uniform bytes) and E8M0 scales around 1 / (3 sqrt(k)) for a [rows, k] weight.
struct HostMx {
  std::vector<uint8_t> q, s;
  int64_t rows = 0, k = 0;
};

inline uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// spread: scale bytes uniform in [center + 2 - spread, center + 1] (4: the usual +-2 around the center; a wide
// spread puts blocks more than 11 exponents below their row's maximum, W4A8's inexact case).
inline HostMx make_mx(int64_t rows, int64_t k, uint64_t seed, int spread = 4) {
  HostMx m;
  m.rows = rows;
  m.k = k;
  m.q.resize(rows * k / 2);
  m.s.resize(rows * k / 32);
  uint64_t st = seed;
  for (size_t i = 0; i < m.q.size(); i += 8) {
    const uint64_t v = splitmix(st);
    for (size_t b = 0; b < 8 && i + b < m.q.size(); ++b) m.q[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  const int center = 127 - static_cast<int>(std::lround(std::log2(3.0 * std::sqrt(static_cast<double>(k)))));
  for (size_t i = 0; i < m.s.size(); ++i) m.s[i] = static_cast<uint8_t>(center + 2 - spread + splitmix(st) % spread);
  return m;
}

inline float e2m1(uint8_t code) {
  static const float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
// Row r of m dotted with v (v.size() == m.k), decoded block by block. w4a8: the weights as design 8 sees
// them (e4m3 code of e2m1 * 2^(6 - d) at the row's reference exponent, times 2^(r - 133)).
inline double mx_row_dot(const HostMx& m, int64_t r, const std::vector<double>& v, bool w4a8 = false) {
  const uint8_t* q = m.q.data() + r * m.k / 2;
  const uint8_t* sc = m.s.data() + r * m.k / 32;
  double total = 0;
  if (w4a8) {
    // value[d][code] = e4m3 value of w4a8_weight_code(code, d), built once (d = 0..255).
    static const std::vector<double> kValue = [] {
      std::vector<double> t(256 * 16);
      for (int d = 0; d < 256; ++d)
        for (uint32_t c = 0; c < 16; ++c) t[d * 16 + c] = fp8_e4m3_to_f32(kernels::w4a8_weight_code(c, d));
      return t;
    }();
    const int ref = *std::max_element(sc, sc + m.k / 32);
    for (int64_t blk = 0; blk < m.k / 32; ++blk) {
      const double* val = kValue.data() + (ref - sc[blk]) * 16;
      double part = 0;
      for (int b = 0; b < 16; ++b) {
        const uint8_t byte = q[blk * 16 + b];
        part += val[byte & 15] * v[blk * 32 + 2 * b] + val[byte >> 4] * v[blk * 32 + 2 * b + 1];
      }
      total += part;
    }
    return total * kernels::w4a8_row_factor(ref);
  }
  for (int64_t blk = 0; blk < m.k / 32; ++blk) {
    double part = 0;
    for (int b = 0; b < 16; ++b) {
      const uint8_t byte = q[blk * 16 + b];
      part += e2m1(byte & 15) * v[blk * 32 + 2 * b] + e2m1(byte >> 4) * v[blk * 32 + 2 * b + 1];
    }
    total += part * std::ldexp(1.0, static_cast<int>(sc[blk]) - 127);
  }
  return total;
}

// v (bf16-exact values) through the per-row e4m3 quantization of W4A8: e4m3(v / scale) * scale.
inline void w4a8_quantize_row(std::vector<double>& v) {
  float amax = 0.f;
  for (double x : v) amax = std::max(amax, std::fabs(static_cast<float>(x)));
  const float scale = kernels::w4a8_act_scale(amax);
  for (double& x : v)
    x = static_cast<double>(fp8_e4m3_to_f32(kernels::w4a8_act_code(static_cast<float>(x), scale))) * scale;
}

// Which GEMMs of the reference run W4A8 (design 8).
struct W4a8Ref {
  bool gate_up = false, down = false;
};

// All experts of one shape on the device (E x the per-expert tensors, concatenated) and on the host.
struct Model {
  Shape shape;
  std::vector<HostMx> gate_up, down;  // per expert: [2I, H], [H, I]
  uint8_t *d_guq = nullptr, *d_gus = nullptr, *d_dnq = nullptr, *d_dns = nullptr;

  explicit Model(const Shape& s, uint64_t seed, int spread = 4) : shape(s) {
    const size_t guq = 2 * s.I * s.H / 2, gus = 2 * s.I * s.H / 32, dnq = s.H * s.I / 2, dns = s.H * s.I / 32;
    MX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_guq), guq * s.E));
    MX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_gus), gus * s.E));
    MX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_dnq), dnq * s.E));
    MX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_dns), dns * s.E));
    for (int e = 0; e < s.E; ++e) {
      gate_up.push_back(make_mx(2 * s.I, s.H, seed * 1000003 + 2 * e, spread));
      down.push_back(make_mx(s.H, s.I, seed * 1000003 + 2 * e + 1, spread));
      MX_CUDA_CHECK(cudaMemcpy(d_guq + e * guq, gate_up.back().q.data(), guq, cudaMemcpyHostToDevice));
      MX_CUDA_CHECK(cudaMemcpy(d_gus + e * gus, gate_up.back().s.data(), gus, cudaMemcpyHostToDevice));
      MX_CUDA_CHECK(cudaMemcpy(d_dnq + e * dnq, down.back().q.data(), dnq, cudaMemcpyHostToDevice));
      MX_CUDA_CHECK(cudaMemcpy(d_dns + e * dns, down.back().s.data(), dns, cudaMemcpyHostToDevice));
    }
  }
  ~Model() {
    cudaFree(d_guq);
    cudaFree(d_gus);
    cudaFree(d_dnq);
    cudaFree(d_dns);
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  kernels::cuda::MoeMxfp4Weights weights() const { return {d_guq, d_gus, d_dnq, d_dns}; }
};

// Routing for T tokens: distinct experts from [0, pool), the first slot forced to `hot` when hot >= 0;
// weights in [0, 1). x: bf16 bits, uniform in [-1, 1).
struct Batch {
  int64_t T = 0;
  std::vector<int32_t> ids;
  std::vector<float> wts;
  std::vector<uint16_t> x;
};
inline Batch make_batch(const Shape& s, int64_t T, int pool, int hot, std::mt19937_64& rng) {
  MX_CHECK_MSG(T > 0 && s.K <= pool && pool <= s.E && hot < pool,
               "moe_synth::make_batch(" << s.name << "): need T > 0, top_k <= pool <= E, hot < pool; got T " << T
                                        << ", top_k " << s.K << ", pool " << pool << ", E " << s.E << ", hot " << hot);
  Batch b;
  b.T = T;
  b.ids.resize(T * s.K);
  b.wts.resize(T * s.K);
  b.x.resize(T * s.H);
  std::vector<int32_t> experts(pool);
  std::uniform_real_distribution<float> u01(0.f, 1.f), u11(-1.f, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int k = 0; k < s.K; ++k) std::swap(experts[k], experts[k + rng() % (pool - k)]);  // partial shuffle
    if (hot >= 0) {
      auto it = std::find(experts.begin(), experts.end(), hot);
      std::swap(*it, experts[0]);
    }
    for (int k = 0; k < s.K; ++k) {
      b.ids[t * s.K + k] = experts[k];
      b.wts[t * s.K + k] = u01(rng);
    }
  }
  for (auto& v : b.x) v = f32_to_bf16(u11(rng));
  return b;
}

// The SwiGLU intermediate of token t, slot k of the host reference: bf16(silu(gate_e x) * up_e x) [I] for
// e = ids[t, k]; w4a8 (design 8 on gate_up): x quantized per row to e4m3, weights as design 8 sees them.
inline std::vector<double> reference_act_of(const Shape& s, const std::vector<HostMx>& gate_up, const Batch& b,
                                            int64_t t, int k, bool w4a8) {
  MX_CHECK_MSG(t >= 0 && t < b.T && k >= 0 && k < s.K,
               "moe_synth::reference_act_of(" << s.name << "): token " << t << " slot " << k << " of a " << b.T
                                              << "-token batch, top_k " << s.K);
  const int e = b.ids[t * s.K + k];
  MX_CHECK_MSG(e >= 0 && e < s.E && static_cast<int64_t>(gate_up.size()) == s.E,
               "moe_synth::reference_act_of(" << s.name << "): token " << t << " slot " << k << " routes to expert "
                                              << e << " of " << s.E << " (" << gate_up.size() << " on the host)");
  std::vector<double> xs(s.H), act(s.I);
  for (int64_t j = 0; j < s.H; ++j) xs[j] = bf16_to_f32(b.x[t * s.H + j]);
  if (w4a8) w4a8_quantize_row(xs);
  const HostMx& gu = gate_up[e];
  for (int64_t f = 0; f < s.I; ++f) {
    const double g = mx_row_dot(gu, f, xs, w4a8), u = mx_row_dot(gu, s.I + f, xs, w4a8);
    act[f] = bf16_to_f32(f32_to_bf16(static_cast<float>(g / (1.0 + std::exp(-g)) * u)));
  }
  return act;
}

// The down projection of one intermediate row `act` ([I], bf16-exact values) by expert e, rounded to bf16
// as the GPU stores y: [H]. w4a8 (design 8 on down): act quantized per row to e4m3 first.
inline std::vector<double> reference_down_of(const Shape& s, const std::vector<HostMx>& down, int e,
                                             std::vector<double> act, bool w4a8) {
  MX_CHECK_MSG(e >= 0 && e < s.E && static_cast<int64_t>(down.size()) == s.E &&
                   static_cast<int64_t>(act.size()) == s.I,
               "moe_synth::reference_down_of(" << s.name << "): expert " << e << " of " << s.E << " ("
                                               << down.size() << " on the host), act of " << act.size()
                                               << " for I " << s.I);
  if (w4a8) w4a8_quantize_row(act);
  std::vector<double> y(s.H);
  for (int64_t n = 0; n < s.H; ++n)
    y[n] = bf16_to_f32(f32_to_bf16(static_cast<float>(mx_row_dot(down[e], n, act, w4a8))));
  return y;
}

// Host reference of output row t (out starts at zero): sum_k w_k down_e(bf16(silu(gate_e x) * up_e x));
// w4a8: the GEMMs that run design 8 (x / the intermediate quantized per row, weights as design 8 sees them).
inline std::vector<double> reference_row_of(const Shape& s, const std::vector<HostMx>& gate_up,
                                            const std::vector<HostMx>& down, const Batch& b, int64_t t,
                                            W4a8Ref w4a8 = {}) {
  MX_CHECK_MSG(t >= 0 && t < b.T, "moe_synth::reference_row_of(" << s.name << "): row " << t << " of a " << b.T
                                                                 << "-token batch");
  std::vector<double> out(s.H, 0.0);
  for (int k = 0; k < s.K; ++k) {
    const std::vector<double> y =
        reference_down_of(s, down, b.ids[t * s.K + k], reference_act_of(s, gate_up, b, t, k, w4a8.gate_up), w4a8.down);
    for (int64_t n = 0; n < s.H; ++n) out[n] += b.wts[t * s.K + k] * y[n];
  }
  return out;
}

inline std::vector<double> reference_row(const Model& m, const Batch& b, int64_t t, W4a8Ref w4a8 = {}) {
  return reference_row_of(m.shape, m.gate_up, m.down, b, t, w4a8);
}

// The MoE on the device for one plan: out (bf16 bits, [T, H]) from zero. Buffers are the caller's.
struct DeviceBatch {
  int64_t T = 0;
  void *x = nullptr, *out = nullptr, *ws = nullptr;
  int32_t* ids = nullptr;
  float* wts = nullptr;
  size_t ws_bytes = 0, out_bytes = 0;
  DeviceBatch(const Shape& s, const Batch& b) : T(b.T) {
    kernels::cuda::MoeShape ms{b.T, s.H, s.I, s.E, s.K};
    ms.fp8_activations = true;  // the larger (W4A8) workspace: every run fits
    ws_bytes = std::max<size_t>(kernels::cuda::moe_mxfp4_workspace_bytes(ms), 1);
    out_bytes = b.T * s.H * 2;
    MX_CUDA_CHECK(cudaMalloc(&x, b.x.size() * 2));
    MX_CUDA_CHECK(cudaMalloc(&out, out_bytes));
    MX_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    MX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids), b.ids.size() * 4));
    MX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&wts), b.wts.size() * 4));
    MX_CUDA_CHECK(cudaMemcpy(x, b.x.data(), b.x.size() * 2, cudaMemcpyHostToDevice));
    MX_CUDA_CHECK(cudaMemcpy(ids, b.ids.data(), b.ids.size() * 4, cudaMemcpyHostToDevice));
    MX_CUDA_CHECK(cudaMemcpy(wts, b.wts.data(), b.wts.size() * 4, cudaMemcpyHostToDevice));
  }
  ~DeviceBatch() {
    cudaFree(x);
    cudaFree(out);
    cudaFree(ws);
    cudaFree(ids);
    cudaFree(wts);
  }
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  // Runs the MoE (out zeroed first, workspace poisoned with NaN so an unwritten element shows); fp8: W4A8
  // (MoeShape::fp8_activations).
  void run(const Model& m, const kernels::cuda::MoeMxfp4Plan& plan, cudaStream_t stream, bool poison = true,
           bool fp8 = false) {
    kernels::cuda::MoeShape ms{T, m.shape.H, m.shape.I, m.shape.E, m.shape.K};
    ms.fp8_activations = fp8;
    MX_CUDA_CHECK(cudaMemsetAsync(out, 0, out_bytes, stream));
    if (poison) MX_CUDA_CHECK(cudaMemsetAsync(ws, 0xff, ws_bytes, stream));
    kernels::cuda::moe_experts_mxfp4(x, ids, wts, m.weights(), out, ms, plan, ws, stream);
  }
  std::vector<uint16_t> out_host() const {
    std::vector<uint16_t> h(out_bytes / 2);
    MX_CUDA_CHECK(cudaMemcpy(h.data(), out, out_bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace mxserve::moe_synth
