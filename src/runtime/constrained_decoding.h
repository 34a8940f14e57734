// Constrained decoding in the engine (structured output): the per-step masks of constrained requests,
// computed on worker threads while the target forward runs (MaskJobs), and speculative verification
// against the constraint (verify_constrained). The grammar itself lives behind LogitConstraint.
// Invariant: a constrained request's token is always chosen from masked logits -- never from the
// device argmax shortcut -- and every draft is judged under the constraint's state after the drafts
// before it (a draft the mask forbids has target probability 0: rejected).
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <span>
#include <vector>

#include "runtime/logit_constraint.h"
#include "runtime/sequence.h"

namespace mxserve::runtime {

// One step's masks. start() launches the jobs; get(i) waits for job i (the time spent waiting is the part
// of the mask cost the forward did not hide).
class MaskJobs {
 public:
  struct Mask {
    std::vector<uint32_t> allowed;  // [mask_words(V)]
    bool complete = false;
  };
  void add(LogitConstraint* c) { constraints_.push_back(c); }
  bool empty() const { return constraints_.empty(); }
  void start(int64_t vocab);
  const Mask& get(size_t i);
  double compute_seconds() const { return compute_seconds_; }  // summed over jobs
  double wait_seconds() const { return wait_seconds_; }
  ~MaskJobs();

 private:
  std::vector<LogitConstraint*> constraints_;
  std::vector<Mask> masks_;
  std::vector<double> job_seconds_;
  std::vector<std::future<void>> workers_;
  bool joined_ = false;
  double compute_seconds_ = 0, wait_seconds_ = 0;
  void join();
};

struct ConstrainedVerdict {
  std::vector<int32_t> path;  // accepted drafts (node indices; chain: 0..n-1)
  int32_t next_token = -1;    // correction or bonus; -1: the constraint allows no token (end the request)
  int32_t depth = 0;          // positions judged (chain length / tree depth)
};

// Verifies seq's drafts (chain or tree) against target rows logits[row0 ..] ([rows, V]) masked by a copy
// of seq->constraint walked along each draft path. Greedy: follow drafts equal to the masked argmax.
// Sampled: lossless rejection sampling on the masked distributions (verify_chain / verify_tree).
ConstrainedVerdict verify_constrained(const Sequence& seq, int32_t n_drafts, const float* logits, int64_t row0,
                                      int64_t V, std::span<const int64_t> eos_ids, uint64_t seed, uint64_t base);

}  // namespace mxserve::runtime
