// ModelExecutor: runs one ForwardBatch and returns, for its logit rows, the device argmax and (when asked)
// host logits, and samples rows on the device (sample). The engine talks to the model only through this,
// so the scheduler can be simulated with a fake model in tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "backend/backend.h"
#include "backend/device_memory.h"
#include "kernels/sampling_params.h"
#include "kvcache/host_tier.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"

namespace mxserve::runtime {

struct ExecOutput {
  Tensor logits;                // host f32 [len(batch.logit_rows), V]; empty when !batch.want_host_logits
  std::vector<int32_t> argmax;  // [len(batch.logit_rows)] greedy token of each logit row (computed on the device)
  Tensor hidden;                // on the backend, [T, H] post-norm hidden states when batch.want_hidden
  // execute_and_sample's rows when the executor sampled them inside the forward (a decode graph's sampling
  // tail, runtime/graph_sampler.h): in.rows' results in order, as sample() would return them.
  bool sampled_in_forward = false;
  std::vector<kernels::SampledRow> sampled = {};
  // The greedy token of logit row r, from argmax when present (fake executors may fill only logits).
  int32_t greedy_token(int64_t r) const;
};

// The speculative steps captured beside plain decode steps (all zero / empty: none).
struct SpecGraphShapes {
  int32_t chain_drafts = 0;    // chain verify steps of 1 + N rows per sequence (N <= chain_drafts); >= 2: the
                               // MTP chain's continuation steps too
  int32_t extend_rows = 0;     // MTP extend steps of 1..extend_rows rows per sequence (accepted + 1)
  std::vector<int32_t> tree_verify_rows;  // tree verify steps: rows per sequence (1 + nodes) of each tree size
  int32_t tree_draft_rows = 0;  // tree draft steps: up to this many rows per sequence (topk)
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual int64_t vocab_size() const = 0;
  virtual Result<ExecOutput> execute(const model::ForwardBatch& batch) = 0;
  // Device-side sampling (Backend::sample_rows, kernels/sampling_params.h) of logit rows of the last
  // execute(), called right after it: in.rows[i].logit_row indexes out's logit rows; only ids (+ requested
  // logprobs) come back. The engine samples here every unconstrained, non-speculative sampled row; rows
  // with a structured-output constraint or verifying drafts keep host logits (batch.want_host_logits).
  // Default (fake executors, which return host logits always): the CPU sampler over out.logits.
  virtual Result<std::vector<kernels::SampledRow>> sample(const ExecOutput& out, const kernels::SampleRowsInput& in);
  // execute() for a step whose device-sampled rows are known before the forward (`in`, built as for
  // sample()): an executor that can sample them inside the forward (decode graphs with the sampling tail)
  // returns them in out.sampled with out.sampled_in_forward; otherwise (the default, and steps it cannot
  // take) the caller calls sample() after it as usual.
  virtual Result<ExecOutput> execute_and_sample(const model::ForwardBatch& batch, const kernels::SampleRowsInput& in) {
    return execute(batch);
  }
  // The MTP (NextN) draft layer, when the model has one (see CausalLM::forward_mtp).
  virtual bool has_mtp() const { return false; }
  virtual Result<ExecOutput> execute_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in) {
    return unsupported("this model has no MTP layer");
  }
  // out[i] = hidden[rows[i]], on the backend.
  virtual Tensor select_rows(const Tensor& hidden, const std::vector<int32_t>& rows) = 0;
  // Gives the KV cache a persistent device block-table store of max_rows x max_blocks_per_seq (the engine's
  // batches carry store rows: model/forward_batch.h). An executor that reads no block tables (a fake
  // model) needs none.
  virtual Status enable_block_tables(int64_t max_rows, int64_t max_blocks_per_seq) { return Status::ok(); }
  using SpecGraphShapes = runtime::SpecGraphShapes;
  // Captures CUDA graphs of pure-decode steps up to max_batch sequences (runtime/decode_graphs.h); needs the
  // block-table store. Later pure-decode batches replay them; everything else runs eagerly. `spec` adds the
  // speculative steps: verify steps (runtime/decode_graphs.h) and MTP draft steps (runtime/mtp_graphs.h; a
  // model without a device-input MTP forward keeps those eager and says so).
  virtual Status enable_decode_graphs(int64_t max_batch, const SpecGraphShapes& spec = {}) {
    return unsupported("this executor has no decode graphs");
  }
  // Target decode / verify steps served by a graph replay so far (tests, logs).
  virtual int64_t graph_replays() const { return 0; }
  struct GraphReplayCounts {
    int64_t decode = 0;       // target steps of one row per sequence
    int64_t verify = 0;       // chain verify steps (up to 1 + N rows per sequence)
    int64_t tree_verify = 0;  // tree verify steps (tree masks)
    int64_t mtp = 0;          // MTP draft-chain continuation steps
    int64_t extend = 0;       // MTP extend steps (the first draft step)
    int64_t tree_draft = 0;   // MTP tree draft steps
    int64_t sampled = 0;      // decode replays whose device-sampled rows were sampled inside the graph
  };
  virtual GraphReplayCounts graph_replay_counts() const { return {}; }
  // Tests: the device row holds the first synced blocks of `table` for `lease` (nothing to check when the
  // row was never synced for that lease).
  virtual Status check_block_table(int32_t row, uint64_t lease, const std::vector<int32_t>& table) {
    return Status::ok();
  }
  // Waits for the device work queued so far (timing the MTP extend for the speculation policy).
  virtual void synchronize() {}
  // Copies cache slot src_slots[i] to dst_slots[i] in every tensor of the model's cache layout, every
  // cached layer (the MTP layer too), pairs in order: compaction of an accepted speculative tree path.
  virtual Status copy_kv(const std::vector<int32_t>& src_slots, const std::vector<int32_t>& dst_slots) {
    return unsupported("this executor cannot copy KV slots (tree speculation)");
  }
  // The host KV tier's block mover over this executor's whole cache layout (every tensor of every cached
  // layer, the MTP layer's too) with n_slots host blocks (pinned memory on CUDA); the executor owns it.
  // Refuses a layout role the tier does not know (runtime/kv_host_mover.h).
  virtual Result<kvcache::BlockMover*> enable_host_tier(int64_t n_slots) {
    return unsupported("this executor has no host KV tier (--kv-cache-host-memory)");
  }
  // Bytes one KV block holds over the whole cache layout (what one host-tier slot takes); 0: no cache.
  virtual uint64_t kv_bytes_per_block() const { return 0; }
  // One rank: the start-up dry run's activation reserve (launch/launch_memory.h KvBudget). Each eager forward's
  // allocator high-water mark above what was live before it is checked against it, and a step over it is said
  // once, loudly, naming its shape (runtime/activation_watch.h; rank groups check their jobs in LockstepModel).
  // Graph replays allocate nothing and are not watched. 0: not watched. `probe` replaces the backend's allocator
  // interval (tests; default backend::take_memory_interval). Executors without device memory ignore it.
  using MemoryProbe = std::function<backend::MemoryInterval()>;
  virtual void watch_activations(uint64_t reserve_bytes, MemoryProbe probe = nullptr) {}
  // Steps said to be over the reserve so far.
  virtual int64_t activation_warnings() const { return 0; }
};

// The real thing: a CausalLM over a paged KV cache of n_blocks x block_size tokens on its backend.
std::unique_ptr<ModelExecutor> make_model_executor(model::CausalLM& model, backend::Backend& be, int64_t n_blocks,
                                                   int64_t block_size);

// KV blocks that fit in `bytes` for this model (every tensor of its cache layout, MTP layer included).
int64_t kv_blocks_for_bytes(const model::CausalLM& model, int64_t block_size, uint64_t bytes);

}  // namespace mxserve::runtime
