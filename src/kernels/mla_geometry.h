// The MLA geometry builder (kernels::MlaParams from the five dimensions, scale (nope + rope)^-0.5) and the
// GLM-5.x latent shape, for the code that builds an MlaParams by hand: the tuner (mxserve tune-attention --mla),
// the CUDA op tests (tests/ops/gpu_oracle.h) and the MLA benchmarks (dev/kernels/bench_device.h). The model
// builds its own from the checkpoint's config (model/layers/mla_attention.cpp).
// Invariant: the scale is computed in float exactly as the per-file copies it replaced did.
#pragma once

#include <cmath>

#include "kernels/mla_params.h"

namespace mxserve::kernels {

// GLM-5.x (glm_moe_dsa) latent attention: qk_nope 192, qk_rope 64, v 256, kv_lora_rank 512.
constexpr int kGlmMlaNope = 192, kGlmMlaRope = 64, kGlmMlaV = 256, kGlmMlaLora = 512;

inline MlaParams mla_params(int n_heads, int nope, int rope, int v, int lora) {
  MlaParams p;
  p.n_heads = n_heads;
  p.qk_nope_dim = nope;
  p.qk_rope_dim = rope;
  p.v_dim = v;
  p.kv_lora_rank = lora;
  p.scale = 1.f / std::sqrt(static_cast<float>(nope + rope));
  return p;
}

inline MlaParams glm_mla_params(int n_heads) {
  return mla_params(n_heads, kGlmMlaNope, kGlmMlaRope, kGlmMlaV, kGlmMlaLora);
}

}  // namespace mxserve::kernels
