// The step message node 0 sends each follower node before every model call of a multi-node launch
// (launch/multinode.h): which call (forward, forward_mtp, copy_kv_slots, quit), the KV cache it runs against
// (an id and its geometry, so the follower keeps a matching cache of its own ranks' heads) and the whole
// ForwardBatch, engine block-table rows included (the follower's table store mirrors node 0's leases).
// Invariant: decode(encode(m)) reproduces every field a forward reads; a truncated or foreign message is an
// error naming the field, never a crash. Host byte order (the nodes of one launch share an architecture).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/forward_batch.h"

namespace mxserve::launch {

enum class StepKind : uint8_t { kForward = 'F', kForwardMtp = 'M', kCopyKvSlots = 'C', kQuit = 'Q' };

struct StepCache {
  uint64_t id = 0;                   // node 0's id of the caller's cache (new geometry -> new id)
  uint64_t drop_id = 0;              // a cache the follower may free (its id was replaced), 0 = none
  int64_t n_blocks = 0, block_size = 0;
  int64_t table_rows = -1, table_max_blocks = -1;  // the engine's block-table store geometry, -1 = none
};

struct StepMessage {
  StepKind kind = StepKind::kQuit;
  StepCache cache;
  model::ForwardBatch batch;
  Tensor hidden_in;                  // forward_mtp: host f32 [T, H]
  Tensor src_slots, dst_slots;       // copy_kv_slots: host i32 [P]
  // Owns the host tables the decoded batch's spans point at (SequenceSpan::host_table).
  std::vector<std::unique_ptr<std::vector<int32_t>>> host_tables;
};

std::string encode_step(StepKind kind, const StepCache& cache, const model::ForwardBatch* batch,
                        const Tensor* hidden_in, const Tensor* src_slots, const Tensor* dst_slots);
Result<std::unique_ptr<StepMessage>> decode_step(const std::string& bytes);

}  // namespace mxserve::launch
