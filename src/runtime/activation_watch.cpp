// ActivationWatch and describe_step (activation_watch.h).
#include "runtime/activation_watch.h"

#include <algorithm>
#include <sstream>

namespace mxserve::runtime {

void ActivationWatch::set_reserve(std::vector<uint64_t> bytes) {
  reserve_ = std::move(bytes);
  warned_.assign(reserve_.size(), 0);
}

bool ActivationWatch::over(int rank, uint64_t used) {
  if (rank < 0 || rank >= static_cast<int>(reserve_.size()) || reserve_[rank] == 0 || used <= reserve_[rank])
    return false;
  uint64_t& last = warned_[rank];
  if (last != 0 && used < last + last / 10) return false;
  last = used;
  return true;
}

std::string describe_step(const model::ForwardBatch& batch) {
  // A chunk of >= 8 rows is a prefill chunk (a verify chunk has 1 + drafts rows, drafts <= 7 for a chain; a
  // wider tree reads as a chunk, which is what its memory is).
  constexpr int32_t kPrefillRows = 8;
  int64_t chunks = 0, chunk_rows = 0, largest = 0, longest = 0, small = 0, small_rows = 0;
  for (const model::SequenceSpan& s : batch.seqs) {
    if (s.n_tokens >= kPrefillRows) {
      ++chunks;
      chunk_rows += s.n_tokens;
      largest = std::max<int64_t>(largest, s.n_tokens);
      longest = std::max<int64_t>(longest, s.kv_len);
    } else {
      ++small;
      small_rows += s.n_tokens;
    }
  }
  auto n_of = [](int64_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  std::ostringstream o;
  o << n_of(batch.n_tokens(), "row") << ": " << n_of(chunks, "prefill chunk") << " of " << n_of(chunk_rows, "row");
  if (chunks > 0) o << " (largest " << largest << ", longest context " << longest << " keys)";
  o << ", " << n_of(small, "decode / verify sequence") << " of " << n_of(small_rows, "row") << "; "
    << n_of(static_cast<int64_t>(batch.logit_rows.size()), "row") << " with logits";
  return o.str();
}

std::string activation_over_reserve_message(int rank, int world, uint64_t used, uint64_t reserve,
                                            const std::string& step_shape) {
  std::ostringstream o;
  if (world > 1) o << "rank " << rank << " of " << world << ": ";
  o << "a step used " << (used >> 20) << " MiB of activations, above the " << (reserve >> 20)
    << " MiB the start-up dry run measured " << (world > 1 ? "for this rank " : "")
    << "(the reserve left beside the KV pool); the step: " << step_shape
    << ". The dry run does not cover this step's shape: a step like it can fail out of memory (its requests fail, "
    << "the server stays up). To make room: lower --gpu-memory-utilization, --max-num-batched-tokens or "
    << "--chunked-prefill-size";
  return o.str();
}

}  // namespace mxserve::runtime
