// The CUDA backend's MLA + DeepSeek sparse attention ops (backend/mla_dsa_ops.h) for glm_moe_dsa: the
// CUDA backend derives from this class, so mla_dsa_ops(be) finds them. Validates dtypes and shapes at each
// op's entry (naming the op and tensors), allocates workspaces from the backend and launches the kernels
// of kernels/cuda/attention/mla_dsa.h on the backend's stream. bf16 activations and caches only.
// Built only when MXSERVE_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/mla_dsa_ops.h"

namespace mxserve::backend {

class CudaMlaDsaOps : public MlaDsaOps {
 public:
  void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& out) override;
  void rope_interleaved(Tensor& x, const Tensor& positions, const kernels::InterleavedRopeParams& p) override;
  void copy_columns(const Tensor& x, int64_t begin, int64_t end, Tensor& out) override;
  void cache_write(const Tensor& rows, const AttentionMeta& meta, Tensor& cache, int64_t col_offset) override;
  // One kernel for a bf16 key cache (kernels/cuda/attention/mla_key_write.h); else the three ops.
  void norm_rope_cache_write(Tensor& k, const Tensor& w, const Tensor& b, float eps, const Tensor& positions,
                             const kernels::InterleavedRopeParams& p, const AttentionMeta& meta,
                             Tensor& cache) override;
  // One kernel on a bf16 latent cache (kernels/cuda/attention/mla_key_write.h); else false.
  bool try_latent_cache_write(const Tensor& kv, int64_t col0, const Tensor& norm_w, float eps, const Tensor& positions,
                              const kernels::InterleavedRopeParams& p, const AttentionMeta& meta,
                              Tensor& cache) override;
  void indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& key_cache, const AttentionMeta& meta,
                    const kernels::IndexerParams& p, Tensor& topk) override;
  void mla_attention(const Tensor& q, const Tensor& latent_cache, const Tensor& kv_b, const Tensor* topk,
                     const AttentionMeta& meta, const kernels::MlaParams& p, Tensor& out) override;

 protected:
  // Called once by the CUDA backend's constructor: where workspaces come from and the stream to launch on.
  void init_mla_dsa(Backend* backend, cudaStream_t stream) {
    mla_backend_ = backend;
    mla_stream_ = stream;
  }

 private:
  Backend* mla_backend_ = nullptr;
  cudaStream_t mla_stream_ = nullptr;
};

}  // namespace mxserve::backend
