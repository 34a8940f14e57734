// Device sampling over inputs already on the device (the tail of a decode CUDA graph, runtime/graph_sampler.h):
// the same two kernels as Backend::sample_rows (logit processing, then the sampler; kernels/sampling_params.h
// semantics), launched on the backend's stream with no host copy, so they can be captured into a graph.
// Invariant: every buffer is the caller's static device memory; the grid is tail.n_sample blocks (fixed per
// captured graph). A row whose logit_row is outside [0, logits rows) is skipped: both kernels return at once
// and its result holds kSampleBadRow (the graph's "no sample in this slot" marker, never read as a token).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/status.h"

namespace mxserve::backend {

// One result slot as the CUDA sampler writes it (layout-checked against kernels/cuda/sampling/sample_rows.h).
struct DeviceSampleSlot {
  int32_t token;
  float logprob;
  int32_t error;        // kernels::SampleErrorCode
  int32_t error_token;
};
static_assert(sizeof(DeviceSampleSlot) == 16, "DeviceSampleSlot: 4 x 4 bytes");

struct DeviceSampleTail {
  Tensor logits;     // f32 [R, V]: the rows slots may sample
  Tensor params;     // u8 [>= n_sample * sizeof(kernels::SampleRowParams)]: slot i's parameters
  Tensor penalties;  // u8: kernels::SamplePenaltyToken entries the rows' ranges index
  Tensor biases;     // u8: kernels::SampleBias entries the rows' ranges index
  Tensor scratch;    // f32 [S, V]: processed copies of rows with bias / penalties (row i: slot i), so only
                     // slots < S may carry bias / penalty entries (the caller stages them first)
  Tensor results;    // u8 [>= n_sample * 16]: DeviceSampleSlot per slot
  Tensor top_ids;    // i32 [>= n_sample * max_top]
  Tensor top_logprobs;  // f32 [>= n_sample * max_top]
  int32_t n_sample = 0;
  int32_t max_top = 0;
};

// Whether enqueue_device_sampling runs on this backend (the CUDA backend of a CUDA build).
bool has_device_sampling_tail(Backend& be);
// Enqueues the processing and sampling kernels on be's stream (capturable). Unsupported on other backends;
// invalid_argument naming the buffer that is too small.
Status enqueue_device_sampling(Backend& be, const DeviceSampleTail& tail);

}  // namespace mxserve::backend
