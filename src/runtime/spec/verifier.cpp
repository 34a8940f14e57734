#include "runtime/spec/verifier.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"

namespace mxserve::runtime {
namespace {

// RNG streams of the unseeded / simulated verification (the seeded mode uses plain sampling's own stream).
constexpr uint64_t kVerifyStream = 0xA5A5A5A5ull;
constexpr uint64_t kCountersPerStep = 256;  // > 2 + the most tree nodes (64)

// norm(max(0, P - Q)) over P's support; empty when P <= Q everywhere.
TokenDistribution residual(const TokenDistribution& P, const TokenDistribution& Q) {
  TokenDistribution r;
  double z = 0;
  for (size_t j = 0; j < P.ids.size(); ++j) {
    const double m = std::max(0.0, P.probs[j] - Q.prob_of(P.ids[j]));
    if (m > 0) {
      r.ids.push_back(P.ids[j]);
      r.probs.push_back(m);
      z += m;
    }
  }
  for (double& m : r.probs) m /= z;
  return r;
}

TokenDistribution point_mass(int32_t token) {
  TokenDistribution d;
  d.ids = {token};
  d.probs = {1.0};
  return d;
}

// One verification: the walk's state and the target's rows, processed lazily (only the rows on the
// accepted path are ever processed: each is O(V)).
class Walk {
 public:
  Walk(const VerifyInput& in, const TargetRows& target)
      : in_(in), t_(target), sp_(*in.sampling), mode_(verify_mode(sp_)), M_(static_cast<int32_t>(in.drafts.size())),
        history_(in.context.generated.begin(), in.context.generated.end()),
        step_(static_cast<uint64_t>(in.context.generated.size())) {}

  int32_t parent(int32_t node) const { return in_.parents.empty() ? node - 1 : in_.parents[node]; }
  int32_t row_of(int32_t node) const { return node + 1; }  // node -1 (the root) is row 0

  Status check_shapes() const {
    if (!in_.parents.empty() && static_cast<int32_t>(in_.parents.size()) != M_)
      return invalid_argument("verify: " + std::to_string(in_.parents.size()) + " parents for " + std::to_string(M_) +
                              " drafts");
    for (int32_t i = 0; i < M_; ++i)
      if (parent(i) < -1 || parent(i) >= i) return invalid_argument("verify: draft tree nodes must be topological");
    if (!in_.proposals.empty() && static_cast<int32_t>(in_.proposals.size()) != M_)
      return invalid_argument("verify: proposals do not match the drafts");
    const int64_t rows = M_ + 1;
    if (!t_.logits.empty() && static_cast<int64_t>(t_.logits.size()) != rows * t_.vocab)
      return invalid_argument("verify: target logits are not [" + std::to_string(rows) + ", V]");
    if (t_.logits.empty() && (static_cast<int64_t>(t_.argmax.size()) != rows || needs_distribution()))
      return invalid_argument("verify: this request needs the target's host logits");
    return Status::ok();
  }

  // Greedy requests without logit processing need only the device's argmax.
  bool needs_distribution() const { return mode_ != VerifyMode::kGreedy || has_logit_processing(sp_); }

  // The target's processed distribution at `node` (the accepted path to it is in history_).
  Result<TokenDistribution> target_at(int32_t node) const {
    const int32_t r = row_of(node);
    std::vector<float> row(t_.logits.begin() + r * t_.vocab, t_.logits.begin() + (r + 1) * t_.vocab);
    process_logits(row, sp_, TokenContext{in_.context.prompt, history_});
    MX_RETURN_IF_ERROR(check_logits(row));
    return sampling_distribution(row, sp_);
  }

  // The token plain decoding would pick after `node` (greedy and seeded modes; depth: tokens accepted so far).
  Result<int32_t> pick_at(int32_t node, size_t depth) const {
    if (mode_ == VerifyMode::kGreedy && !needs_distribution()) {
      const int32_t r = row_of(node);
      if (!t_.argmax.empty()) return t_.argmax[r];
      std::span<const float> row = t_.logits.subspan(r * t_.vocab, t_.vocab);
      MX_RETURN_IF_ERROR(check_logits(row));
      return argmax_of(row);
    }
    MX_ASSIGN_OR_RETURN(TokenDistribution P, target_at(node));
    return mode_ == VerifyMode::kGreedy ? P.argmax() : P.draw(counter_uniform(in_.seed, step_ + depth));
  }

  double verify_uniform(uint64_t k) const {
    return counter_uniform(in_.seed ^ kVerifyStream, step_ * kCountersPerStep + k);
  }

  void accept(Verdict& v, int32_t node) {
    v.path.push_back(node);
    history_.push_back(in_.drafts[node]);
  }

  Result<Verdict> run() {
    MX_RETURN_IF_ERROR(check_shapes());
    std::vector<std::vector<int32_t>> children(M_ + 1);  // [node + 1]: children in node order
    std::vector<int32_t> depth_of(M_);
    Verdict v;
    for (int32_t i = 0; i < M_; ++i) {
      children[parent(i) + 1].push_back(i);
      depth_of[i] = parent(i) < 0 ? 1 : depth_of[parent(i)] + 1;
      v.depth = std::max(v.depth, depth_of[i]);
    }
    int32_t cur = -1;
    int32_t next_token = -1;
    if (in_.simulate_acceptance) {
      // Benchmark mode: the path to the first node (in node order) at the simulated depth.
      const double want = *in_.simulate_acceptance - 1.0 + verify_uniform(0);
      const int32_t n_acc = std::clamp(static_cast<int32_t>(want), 0, v.depth);
      int32_t leaf = -1;
      for (int32_t i = 0; i < M_ && n_acc > 0 && leaf < 0; ++i)
        if (depth_of[i] == n_acc) leaf = i;
      std::vector<int32_t> path;
      for (int32_t a = leaf; a >= 0; a = parent(a)) path.push_back(a);
      for (auto it = path.rbegin(); it != path.rend(); ++it) accept(v, cur = *it);
      if (mode_ == VerifyMode::kRejection) {
        MX_ASSIGN_OR_RETURN(TokenDistribution P, target_at(cur));
        next_token = P.draw(verify_uniform(1));
      } else {
        MX_ASSIGN_OR_RETURN(next_token, pick_at(cur, v.path.size()));
      }
    } else if (mode_ != VerifyMode::kRejection) {
      // Follow the child carrying the token plain decoding picks; stop where none does.
      for (;;) {
        MX_ASSIGN_OR_RETURN(const int32_t want, pick_at(cur, v.path.size()));
        int32_t nxt = -1;
        for (int32_t c : children[cur + 1])
          if (in_.drafts[c] == want) {
            nxt = c;
            break;
          }
        if (nxt < 0) {
          next_token = want;
          break;
        }
        accept(v, cur = nxt);
      }
    } else {
      // Recursive rejection: try the children in order; child c with proposal Q is accepted with probability
      // min(1, P(c) / Q(c)) (top-k candidates: Q = a point mass on c); on rejection P <- norm(max(0, P - Q)).
      // When no child is accepted the next token is drawn from what is left of P.
      uint64_t k = 2;
      for (;;) {
        MX_ASSIGN_OR_RETURN(TokenDistribution P, target_at(cur));
        int32_t nxt = -1;
        for (int32_t c : children[cur + 1]) {
          const TokenDistribution Q = in_.proposals.empty() ? point_mass(in_.drafts[c]) : in_.proposals[c];
          const double qc = Q.prob_of(in_.drafts[c]), pc = P.prob_of(in_.drafts[c]);
          if (qc > 0 && verify_uniform(k++) < std::min(1.0, pc / qc)) {
            nxt = c;
            break;
          }
          TokenDistribution r = residual(P, Q);
          if (r.ids.empty()) break;  // P <= Q on P's support: P and Q agree, draw from P as it is
          P = std::move(r);
        }
        if (nxt < 0) {
          next_token = P.draw(verify_uniform(1));
          break;
        }
        accept(v, cur = nxt);
      }
    }
    for (size_t i = 0; i < v.path.size(); ++i) {
      v.tokens.push_back(in_.drafts[v.path[i]]);
      v.rows.push_back(i == 0 ? 0 : row_of(v.path[i - 1]));
      const int32_t from = 1 + v.path[i], to = 1 + static_cast<int32_t>(i);
      if (from != to) v.kv_moves.emplace_back(from, to);
    }
    v.tokens.push_back(next_token);
    v.rows.push_back(v.path.empty() ? 0 : row_of(v.path.back()));
    return v;
  }

 private:
  const VerifyInput& in_;
  const TargetRows& t_;
  const SamplingParams& sp_;
  const VerifyMode mode_;
  const int32_t M_;
  std::vector<int32_t> history_;  // the output before the current node's next token
  const uint64_t step_;           // output index of the root's next token
};

}  // namespace

VerifyMode verify_mode(const SamplingParams& p) {
  if (is_greedy(p)) return VerifyMode::kGreedy;
  return p.seed ? VerifyMode::kSeeded : VerifyMode::kRejection;
}

Result<Verdict> verify_drafts(const VerifyInput& in, const TargetRows& target) {
  MX_CHECK(in.sampling != nullptr);
  Walk walk(in, target);
  return walk.run();
}

}  // namespace mxserve::runtime
