// GraphSampler: sampling inside the decode CUDA graphs (runtime/decode_graphs.h, item 3 of issue 33). Every
// plain decode bucket (one row per sequence, C = batch rows) ends with the greedy argmax of its C logit rows
// and the device sampler (backend/device_sampling.h) over C fixed slots: the step's device-sampled rows
// (ModelExecutor::sample's input) fill the first slots, rows with bias / penalty entries first (only the
// first kGraphSampleProcessedRows slots have a processed-row scratch), and every other slot is skipped
// (logit_row -1: both kernels return at once). Before a replay the host writes the slots' parameters and the
// step's bias / penalty entries into static device buffers (as it writes the graph's input rows); after it
// ONE download returns the argmax ids, the sampled tokens and the logprobs asked for. What this removes per
// decode step: the argmax and sampler launches, the sampler's input upload (an allocation) and the separate
// download + synchronization of the sampled rows.
// Invariants:
//   - the tail computes what the path after the replay computes: the same argmax kernel over the same logit
//     rows, the same sampler kernels with the same per-row parameters (a row's result does not depend on its
//     slot or on the other rows: the draw is counter_uniform(seed, output index)), so greedy ids, sampled
//     tokens, logprobs and error codes are bit-identical with the tail on and off;
//   - a step the tail cannot take (more top logprobs than kGraphSampleMaxTop, more processed rows than
//     kGraphSampleProcessedRows, bias / penalty entries past the static buffers, a row outside the step's
//     rows) stages every slot skipped and is sampled after the replay exactly as before (decided per step,
//     said once per reason);
//   - slots past the step's sampled rows (every padding row's included) are skipped: no visible token;
//   - buffers are shared by every graph (one replay at a time, like the graphs' logits); a C-row bucket's
//     output layout is GraphTailLayout::of(C) inside the shared output buffer; the scratch is
//     [kGraphSampleProcessedRows, V] f32, not [C, V] (GLM's vocabulary: 19 MiB instead of 155 at 256 rows).
// MXSERVE_GRAPH_SAMPLING=0 captures no tail (the sampling after the replay, for before/after runs).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_sampling.h"
#include "core/status.h"
#include "kernels/sampling_params.h"

namespace mxserve::runtime {

// Top logprobs per row the tail returns (the server's --max-logprobs default, vLLM's); rows asking more
// are sampled after the replay.
inline constexpr int32_t kGraphSampleMaxTop = 20;
// Rows with logit_bias / penalties one replay's tail processes (its scratch rows); more: after the replay.
inline constexpr int32_t kGraphSampleProcessedRows = 32;

// Whether decode graphs capture the sampling tail: MXSERVE_GRAPH_SAMPLING unset / 1 / on (default) or
// 0 / off / false. Another value is an error naming it.
Result<bool> graph_sampling_from_env();

// Static capacity of the tail's buffers (for a graph set of max_rows slots).
struct GraphSamplerCaps {
  int32_t max_top = kGraphSampleMaxTop;
  int64_t processed_rows = kGraphSampleProcessedRows;  // slots that may carry bias / penalty entries
  int64_t penalties = 0;  // SamplePenaltyToken entries per step, all rows together
  int64_t biases = 0;     // SampleBias entries per step
  static GraphSamplerCaps for_rows(int64_t max_rows);  // 8192 penalty and 512 bias entries a slot (>= 64k / 4k)
};

// Where a C-slot tail writes, in i32 units of the shared output buffer: argmax [C], results [C, 4]
// (backend::DeviceSampleSlot), top ids [C, max_top], top logprobs (f32 bits) [C, max_top].
struct GraphTailLayout {
  int64_t argmax = 0, results = 0, top_ids = 0, top_logprobs = 0, end = 0;
  static GraphTailLayout of(int64_t C, int32_t max_top);
};

// The C slots of one replay: in->rows fill slots [0, n), rows with bias / penalty entries first (each group
// in in's order), slots [n, C) skipped; slot_of[i] is in->rows[i]'s slot. Returns "" when the tail takes the
// step (also when `in` is null or empty), else why not (then every slot is skipped). T: the step's real
// logit rows (a row's logit_row must be one of them).
std::string stage_graph_sample_slots(const kernels::SampleRowsInput* in, int64_t T, int64_t C,
                                     const GraphSamplerCaps& caps, std::vector<kernels::SampleRowParams>* slots,
                                     std::vector<int32_t>* slot_of);

// in.rows' results from a downloaded tail output (`host`: i32, GraphTailLayout::of(C, max_top) ranges; the
// top ranges only read for rows with n_top > 0), as Backend::sample_rows returns them.
std::vector<kernels::SampledRow> unpack_graph_samples(const int32_t* host, int64_t C, int32_t max_top,
                                                      const kernels::SampleRowsInput& in,
                                                      const std::vector<int32_t>& slot_of, int64_t vocab);

// What a replay of a graph with the tail returns besides its logits.
struct GraphSampleOutput {
  bool tail = false;             // the replayed graph ends with the tail: argmax is filled
  std::vector<int32_t> argmax;   // [T] greedy id of each real row
  bool sampled = false;          // the step's rows were sampled in the graph: rows holds them
  std::vector<kernels::SampledRow> rows;  // in.rows' results, in order
};

class GraphSampler {
 public:
  GraphSampler(backend::Backend& be, int64_t max_rows, int64_t vocab);
  // The static buffers (params, entries, scratch [processed rows, V] f32, outputs), every slot skipped. Logs sizes.
  Status allocate();

  // What a C-row bucket's capture body enqueues after the forward (held by value in the body).
  struct Tail {
    backend::Backend* be = nullptr;
    Tensor logits;   // f32 [C, V]: the bucket's rows of the graphs' logits
    Tensor argmax;   // i32 [C]
    backend::DeviceSampleTail sample;
    Status enqueue() const;
  };
  Tail tail(const Tensor& logits, int64_t C) const;

  // Before a replay of a C-slot tail: writes the slots for `in` (nullptr: no device-sampled rows). Returns
  // whether in's rows are sampled in the graph (false: the caller samples after the replay; the reason is
  // logged once per kind).
  bool stage(const kernels::SampleRowsInput* in, int64_t T, int64_t C);
  // After that replay: one download of argmax [T] and, when `sampled`, in's rows.
  void read(const kernels::SampleRowsInput* in, int64_t T, int64_t C, bool sampled, GraphSampleOutput* out);

  int64_t sampled_replays() const { return sampled_replays_; }  // replays whose rows were sampled in the graph
  const GraphSamplerCaps& caps() const { return caps_; }
  const Tensor& output_buffer() const { return out_; }  // tests: the raw tail output (GraphTailLayout)

 private:
  backend::Backend& be_;
  int64_t max_rows_, vocab_;
  GraphSamplerCaps caps_;
  Tensor params_;     // u8 [max_rows * sizeof(SampleRowParams)]
  Tensor penalties_;  // u8 [caps.penalties * sizeof(SamplePenaltyToken)]
  Tensor biases_;     // u8 [caps.biases * sizeof(SampleBias)]
  Tensor scratch_;    // f32 [min(max_rows, caps.processed_rows), V]
  Tensor out_;        // i32 [GraphTailLayout::of(max_rows).end]: a C-slot tail uses of(C)'s ranges
  std::vector<kernels::SampleRowParams> slots_;  // one replay's staged slots
  std::vector<int32_t> slot_of_;                 // its rows' slots
  int64_t real_end_ = 0;  // device slots [real_end_, max_rows) are all skipped (no rewrite needed)
  int64_t sampled_replays_ = 0;
  std::set<std::string> said_;  // reasons already logged
};

}  // namespace mxserve::runtime
