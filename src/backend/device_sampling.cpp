#include "backend/device_sampling.h"

#include <cstddef>
#include <string>

#include "kernels/sampling_params.h"

#ifdef MXSERVE_HAVE_CUDA
#include "backend/cuda_backend.h"
#include "kernels/cuda/sampling/sample_rows.h"
#endif

namespace mxserve::backend {

#ifdef MXSERVE_HAVE_CUDA
namespace kc = kernels::cuda;
static_assert(sizeof(kc::DeviceSampleResult) == sizeof(DeviceSampleSlot) &&
                  offsetof(kc::DeviceSampleResult, token) == offsetof(DeviceSampleSlot, token) &&
                  offsetof(kc::DeviceSampleResult, logprob) == offsetof(DeviceSampleSlot, logprob) &&
                  offsetof(kc::DeviceSampleResult, error) == offsetof(DeviceSampleSlot, error) &&
                  offsetof(kc::DeviceSampleResult, error_token) == offsetof(DeviceSampleSlot, error_token),
              "DeviceSampleSlot must mirror kernels::cuda::DeviceSampleResult");
#endif

bool has_device_sampling_tail(Backend& be) {
#ifdef MXSERVE_HAVE_CUDA
  return be.device().type == DeviceType::kCUDA && be.name() == "cuda";
#else
  (void)be;
  return false;
#endif
}

Status enqueue_device_sampling(Backend& be, const DeviceSampleTail& t) {
  if (!has_device_sampling_tail(be))
    return unsupported("device sampling tail: backend '" + be.name() + "' has none (CUDA only)");
  const int64_t n = t.n_sample;
  auto too_small = [&](const char* what, const Tensor& x, uint64_t need) -> Status {
    return invalid_argument(std::string("device sampling tail: ") + what + " " + x.describe() + " holds fewer than " +
                            std::to_string(need) + " bytes for " + std::to_string(n) + " slots");
  };
  if (n <= 0 || t.max_top < 0 || t.logits.ndim() != 2 || t.logits.dtype() != DType::kF32)
    return invalid_argument("device sampling tail: " + std::to_string(n) + " slots, max_top " +
                            std::to_string(t.max_top) + ", logits " + t.logits.describe());
  const int64_t V = t.logits.dim(1);
  if (t.params.nbytes() < n * sizeof(kernels::SampleRowParams))
    return too_small("params", t.params, n * sizeof(kernels::SampleRowParams));
  if (t.scratch.ndim() != 2 || t.scratch.dtype() != DType::kF32 || t.scratch.dim(1) != V || t.scratch.dim(0) < 1)
    return invalid_argument("device sampling tail: scratch " + t.scratch.describe() + " is not f32 [S, " +
                            std::to_string(V) + "]");
  if (t.results.nbytes() < n * sizeof(DeviceSampleSlot)) return too_small("results", t.results, n * 16);
  if (t.top_ids.nbytes() < static_cast<uint64_t>(n * t.max_top) * 4)
    return too_small("top_ids", t.top_ids, n * t.max_top * 4);
  if (t.top_logprobs.nbytes() < static_cast<uint64_t>(n * t.max_top) * 4)
    return too_small("top_logprobs", t.top_logprobs, n * t.max_top * 4);
#ifdef MXSERVE_HAVE_CUDA
  kc::DeviceSampleArgs a;
  a.logits = t.logits.data<float>();
  a.n_logit_rows = t.logits.dim(0);
  a.vocab = V;
  a.rows = static_cast<const kernels::SampleRowParams*>(t.params.raw());
  a.n_sample = static_cast<int32_t>(n);
  a.penalties = static_cast<const kernels::SamplePenaltyToken*>(t.penalties.raw());
  a.biases = static_cast<const kernels::SampleBias*>(t.biases.raw());
  a.scratch = t.scratch.data<float>();
  a.out = static_cast<kc::DeviceSampleResult*>(t.results.raw());
  a.max_top = t.max_top;
  a.top_ids = t.top_ids.data<int32_t>();
  a.top_logprobs = t.top_logprobs.data<float>();
  cudaStream_t stream = cuda_backend_stream(be);
  // Processing always enqueued: rows without bias / penalty entries (and skipped slots) return at once.
  kc::process_sample_rows(a, stream);
  kc::sample_rows(a, stream);
  return Status::ok();
#else
  return unsupported("device sampling tail: built without CUDA");
#endif
}

}  // namespace mxserve::backend
