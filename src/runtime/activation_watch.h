// ActivationWatch: every serving step's activation high-water mark on each rank against the activation reserve
// the start-up dry run measured for that rank (launch/launch_memory.h). The KV budget gives the reserve to each rank,
// and the KV pool takes the rest of --gpu-memory-utilization, so a step of a shape the dry run did not cover
// that needs more is where an out-of-memory comes from (worst on a GPU shared by several ranks, the one-GPU
// stand-in, where the ranks peak together). A rank going over its reserve is said once, loudly, naming the
// step's shape (and again only after another 10%), before any allocation fails; an out-of-memory failure of a
// step names its shape too. Several ranks: LockstepModel::run_each (launch/lockstep_model.h); one rank: the
// model executor's eager forwards (runtime/executor.h watch_activations).
// Cost: one locked read of each rank's allocator counters before and after a rank's job; CPU ranks: none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/forward_batch.h"

namespace mxserve::runtime {

class ActivationWatch {
 public:
  // bytes[r]: rank r's reserve; empty (the default) or a 0 entry: that rank is not watched.
  void set_reserve(std::vector<uint64_t> bytes);
  const std::vector<uint64_t>& reserve() const { return reserve_; }
  // Whether rank r's step that used `used` bytes above what was live before it deserves a warning now: over
  // the reserve, and the first time or >= 10% above the last warned amount (which it then becomes).
  bool over(int rank, uint64_t used);

 private:
  std::vector<uint64_t> reserve_, warned_;
};

// One line for logs: "8190 rows: 4 prefill chunks of 8180 rows (largest 2000, longest context 2000 keys),
// 2 decode / verify sequences of 8 rows; 12 rows with logits".
std::string describe_step(const model::ForwardBatch& batch);

// The warning for a step over its rank's reserve (one text for one rank and for rank groups): the bytes, the
// reserve, the step's shape (describe_step or what the caller knows of it) and what to do. world 1: no rank named.
std::string activation_over_reserve_message(int rank, int world, uint64_t used, uint64_t reserve,
                                            const std::string& step_shape);

}  // namespace mxserve::runtime
