// Constrained decoding (constrained_decoding.h): mask jobs and verification under a constraint.
#include "runtime/constrained_decoding.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "runtime/sampler.h"
#include "runtime/spec/speculative.h"
#include "runtime/spec/verifier.h"

namespace mxserve::runtime {
namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool is_terminator(int32_t t, std::span<const int64_t> eos, const SamplingParams& sp) {
  return (!sp.ignore_eos && std::find(eos.begin(), eos.end(), static_cast<int64_t>(t)) != eos.end()) ||
         std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), t) != sp.stop_token_ids.end();
}

}  // namespace

int64_t apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed, bool complete,
                         std::span<const int64_t> eos_ids, std::span<const int32_t> stop_ids) {
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<float> keep;
  if (complete) {  // terminators survive the mask
    for (int64_t e : eos_ids)
      if (e >= 0 && e < V) keep.push_back(logits[e]);
    for (int32_t s : stop_ids)
      if (s >= 0 && s < V) keep.push_back(logits[s]);
  }
  int64_t left = 0;
  for (int64_t w = 0; w * 32 < V; ++w) {
    const uint32_t bits = w < static_cast<int64_t>(allowed.size()) ? allowed[w] : 0u;
    const int64_t end = std::min<int64_t>(V, w * 32 + 32);
    if (bits == 0u) {
      std::fill(logits.begin() + w * 32, logits.begin() + end, -INFINITY);
      continue;
    }
    for (int64_t t = w * 32; t < end; ++t) {
      if ((bits >> (t & 31)) & 1u) ++left;
      else logits[t] = -INFINITY;
    }
  }
  if (complete) {
    size_t k = 0;
    auto restore = [&](int64_t t) {
      if (t < 0 || t >= V) return;
      if (logits[t] == -INFINITY) ++left;
      logits[t] = keep[k++];
    };
    for (int64_t e : eos_ids) restore(e);
    for (int32_t s : stop_ids) restore(s);
  }
  return left;
}

void MaskJobs::start(int64_t vocab) {
  const size_t n = constraints_.size();
  masks_.assign(n, Mask{std::vector<uint32_t>(static_cast<size_t>(mask_words(vocab))), false});
  job_seconds_.assign(n, 0.0);
  if (n == 0) return;
  const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t n_workers = std::min<size_t>(n, std::max<size_t>(1, std::min<size_t>(hw / 2, 16)));
  for (size_t w = 0; w < n_workers; ++w) {
    workers_.push_back(std::async(std::launch::async, [this, w, n, n_workers] {
      for (size_t i = w; i < n; i += n_workers) {
        const auto t0 = Clock::now();
        masks_[i].complete = constraints_[i]->complete();
        constraints_[i]->fill_allowed(masks_[i].allowed);
        job_seconds_[i] = since(t0);
      }
    }));
  }
}

void MaskJobs::join() {
  if (joined_) return;
  const auto t0 = Clock::now();
  for (auto& w : workers_) w.get();
  wait_seconds_ = since(t0);
  for (double s : job_seconds_) compute_seconds_ += s;
  joined_ = true;
}

const MaskJobs::Mask& MaskJobs::get(size_t i) {
  join();
  return masks_[i];
}

MaskJobs::~MaskJobs() {
  for (auto& w : workers_)
    if (w.valid()) w.wait();
}

ConstrainedVerdict verify_constrained(const Sequence& seq, int32_t n_drafts, const float* logits, int64_t row0,
                                      int64_t V, std::span<const int64_t> eos_ids, uint64_t seed, uint64_t base) {
  const SamplingParams& sp = seq.sampling;
  const bool tree = !seq.draft_parents.empty();
  auto parent_of = [&](int32_t i) { return tree ? seq.draft_parents[i] : i - 1; };
  // states[i + 1]: the constraint after the path to draft i (nullptr: the path is not allowed); states[0]
  // the current one. Row r + 1 of the target predicts the token after draft r.
  std::vector<std::unique_ptr<LogitConstraint>> states(n_drafts + 1);
  states[0] = seq.constraint->clone();
  std::vector<char> ended(n_drafts + 1, 0);  // the path ends with a terminator
  std::vector<float> row(V);
  std::vector<uint32_t> allowed(static_cast<size_t>(mask_words(V)));
  std::vector<char> has_row(n_drafts + 1, 0);
  std::vector<std::vector<float>> masked(n_drafts + 1);
  auto masked_row = [&](int32_t r) -> const std::vector<float>& {  // r: 0 = root, i + 1 = draft i
    if (!has_row[r]) {
      masked[r].assign(logits + (row0 + r) * V, logits + (row0 + r + 1) * V);
      LogitConstraint* c = states[r].get();
      if (c != nullptr && !ended[r]) {
        c->fill_allowed(allowed);
        apply_token_mask(masked[r], allowed, c->complete(), eos_ids, sp.stop_token_ids);
      } else {
        std::fill(masked[r].begin(), masked[r].end(), -INFINITY);
      }
      has_row[r] = 1;
    }
    return masked[r];
  };
  for (int32_t i = 0; i < n_drafts; ++i) {
    const int32_t pr = parent_of(i) + 1;
    LogitConstraint* pc = states[pr].get();
    if (pc == nullptr || ended[pr]) continue;
    const int32_t tok = seq.drafts[i];
    if (is_terminator(tok, eos_ids, sp)) {
      if (pc->complete()) {
        states[i + 1] = pc->clone();
        ended[i + 1] = 1;
      }
      continue;
    }
    auto c = pc->clone();
    if (c->accept(tok)) states[i + 1] = std::move(c);
  }
  ConstrainedVerdict v;
  auto row_alive = [&](int32_t r) {
    const auto& m = masked_row(r);
    return std::any_of(m.begin(), m.end(), [](float x) { return x != -INFINITY; });
  };
  if (!row_alive(0)) {
    v.next_token = -1;
  } else {
    // Every mode through the one verifier (spec/verifier.h) on the masked rows, so penalties, seeds and the
    // rejection rule are exactly plain decoding's. Rows no accepted path can reach (a forbidden draft: target
    // probability 0 in its parent's masked row) keep their raw logits as placeholders.
    std::vector<float> buf(static_cast<size_t>((n_drafts + 1) * V));
    for (int32_t r = 0; r <= n_drafts; ++r) {
      const float* src = row_alive(r) ? masked_row(r).data() : logits + (row0 + r) * V;
      std::copy(src, src + V, buf.begin() + static_cast<size_t>(r) * V);
    }
    VerifyInput in;
    in.drafts = std::span<const int32_t>(seq.drafts.data(), n_drafts);
    in.parents = seq.draft_parents;
    in.proposals = seq.draft_q;
    in.sampling = &sp;
    in.context = {std::span<const int32_t>(seq.tokens.data(), seq.prompt_len),
                  std::span<const int32_t>(seq.tokens.data() + seq.prompt_len, seq.n_generated())};
    in.seed = sampling_seed(sp, seq.seed);
    TargetRows target;
    target.vocab = V;
    target.logits = buf;
    Result<Verdict> r = verify_drafts(in, target);
    if (r.is_ok()) {
      v.path = r->path;
      v.next_token = r->tokens.size() > r->path.size() ? r->tokens.back() : -1;
    } else {
      v.next_token = -1;  // the row after the accepted path allows nothing: the request ends (end_unconstrainable)
    }
  }
  std::vector<int32_t> node_depth(n_drafts, 0);
  for (int32_t i = 0; i < n_drafts; ++i) {
    node_depth[i] = parent_of(i) < 0 ? 1 : node_depth[parent_of(i)] + 1;
    v.depth = std::max(v.depth, node_depth[i]);
  }
  return v;
}

}  // namespace mxserve::runtime
