// What the MXFP4 MoE kernel tests share on top of gpu_oracle.h and moe_mxfp4_synth.h (test_cuda_moe_mxfp4_wg,
// _wg8, _pd, test_cuda_moe_prefill_dequant): the rel L2 that fails an all-zero reference, the sampled rows of a
// large-M run, the seed (random, printed, overridable by an environment variable), bf16 bits as doubles, and
// the CPU backend's moe_experts over the dequantized synthetic weights (the reference the host decoder is
// checked against).
// Invariant: each helper is the per-file copy it replaced, unchanged (same arithmetic, same RNG use).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/numeric.h"
#include "gpu_oracle.h"
#include "moe_mxfp4_synth.h"
#include "quant/mxfp4.h"

namespace mxserve::moe_oracle {

// rel L2 of got vs ref (gpu_oracle.h); INFINITY on a NaN, a size mismatch or an empty / all-zero ref (nothing
// compared).
inline double rel_l2(const std::vector<double>& got, const std::vector<double>& ref, double* max_abs) {
  const gpu_oracle::Err e = gpu_oracle::compare(got, ref, /*zero_ref_fails=*/true);
  *max_abs = e.max_abs;
  return e.rel_l2;
}

// Rows checked against the host reference (~0.5-1 s a row): first, last, middle, a third; distinct, all < T.
inline std::vector<int64_t> sampled_rows(int64_t T) {
  std::vector<int64_t> rows;
  for (int64_t t : {int64_t{0}, T - 1, T / 2, T / 3 + 1})
    if (t >= 0 && t < T && std::find(rows.begin(), rows.end(), t) == rows.end()) rows.push_back(t);
  return rows;
}

inline bool any_nonzero(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return x != 0.0; });
}

inline bool all_finite_nonzero(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); }) && any_nonzero(v);
}

// The seed in the environment variable `env` when set, else a random one (the caller prints it).
inline uint32_t test_seed(const char* env) {
  const char* v = std::getenv(env);
  return v != nullptr ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : std::random_device{}();
}

// test_seed(env), printed (and flushed) as "<what>: seed N (rerun with <env>=N)".
inline uint32_t announced_seed(const char* env, const char* what) {
  const uint32_t seed = test_seed(env);
  std::printf("%s: seed %u (rerun with %s=%u)\n", what, seed, env, seed);
  std::fflush(stdout);
  return seed;
}

inline std::vector<double> bf16_to_f64(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_to_f32(bits[i]);
  return v;
}

// The CPU backend's moe_experts on b (x as f32, its routing) over gate_up / down dequantized to f32 (per expert
// [2I, H], [H, I]): the f32 output [T, H] on the host.
inline Tensor cpu_moe_reference(const moe_synth::Shape& s, const std::vector<moe_synth::HostMx>& gate_up,
                                const std::vector<moe_synth::HostMx>& down, const moe_synth::Batch& b) {
  Tensor cgu = Tensor::empty(DType::kF32, {s.E, 2 * s.I, s.H}), cdn = Tensor::empty(DType::kF32, {s.E, s.H, s.I});
  auto as_tensor = [](const std::vector<uint8_t>& v, int64_t rows) {
    Tensor t = Tensor::empty(DType::kU8, {rows, static_cast<int64_t>(v.size()) / rows});
    std::memcpy(t.raw(), v.data(), v.size());
    return t;
  };
  for (int e = 0; e < s.E; ++e) {
    const Tensor fgu =
        quant::dequantize_mxfp4(as_tensor(gate_up[e].q, 2 * s.I), as_tensor(gate_up[e].s, 2 * s.I), s.H);
    const Tensor fdn = quant::dequantize_mxfp4(as_tensor(down[e].q, s.H), as_tensor(down[e].s, s.H), s.I);
    std::memcpy(cgu.data<float>() + e * 2 * s.I * s.H, fgu.raw(), fgu.nbytes());
    std::memcpy(cdn.data<float>() + e * s.H * s.I, fdn.raw(), fdn.nbytes());
  }
  Tensor x = Tensor::empty(DType::kF32, {b.T, s.H}), ids = Tensor::empty(DType::kI32, {b.T, s.K});
  Tensor wts = Tensor::empty(DType::kF32, {b.T, s.K}), out = Tensor::empty(DType::kF32, {b.T, s.H});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = bf16_to_f32(b.x[i]);
  std::memcpy(ids.raw(), b.ids.data(), b.ids.size() * 4);
  std::memcpy(wts.raw(), b.wts.data(), b.wts.size() * 4);
  for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = 0.f;
  auto cpu = backend::make_cpu_backend();
  Tensor dout = cpu->upload(out);
  backend::ExpertWeights experts;
  experts.gate_up = cpu->upload(cgu);
  experts.down = cpu->upload(cdn);
  cpu->moe_experts(cpu->upload(x), ids, wts, experts, dout);
  return cpu->to_host(dout);
}

}  // namespace mxserve::moe_oracle
