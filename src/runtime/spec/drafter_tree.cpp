// Drafter::draft_tree: tree drafting (EAGLE-2 style), the MTP steps after the extend.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "runtime/sampler.h"
#include "runtime/spec/drafter.h"

namespace mxserve::runtime {
namespace {

// The k most likely candidates of a draft row with their log-probabilities, best first (ties: lower id),
// under the row processed like the target's after `path` (penalties, logit mask). Greedy requests rank the
// processed logits (log-softmax); sampled ones their processed distribution q, so every candidate is one
// the request could sample. Empty when the row is unusable (NaN, nothing allowed).
std::vector<std::pair<int32_t, double>> top_candidates(const Sequence& seq, std::span<const float> row,
                                                       std::span<const int32_t> path, int32_t k) {
  std::vector<std::pair<int32_t, double>> c;
  auto processed = processed_draft_row(seq, row, path);
  if (!processed) return c;
  const std::vector<float>& lr = *processed;
  if (is_greedy(seq.sampling)) {
    const int64_t V = static_cast<int64_t>(lr.size());
    const float mx = *std::max_element(lr.begin(), lr.end());
    double z = 0;
    for (float x : lr) z += std::exp(static_cast<double>(x) - mx);
    const double lz = std::log(z);
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t kk = std::min<int64_t>(k, V);
    auto better = [&](int32_t a, int32_t b) { return lr[a] > lr[b] || (lr[a] == lr[b] && a < b); };
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), better);
    for (int64_t i = 0; i < kk && std::isfinite(lr[idx[i]]); ++i)
      c.emplace_back(idx[i], static_cast<double>(lr[idx[i]]) - mx - lz);
  } else {
    const TokenDistribution q = sampling_distribution(lr, seq.sampling);
    std::vector<size_t> idx(q.ids.size());
    std::iota(idx.begin(), idx.end(), size_t{0});
    const size_t kk = std::min<size_t>(k, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](size_t a, size_t b) {
      return q.probs[a] > q.probs[b] || (q.probs[a] == q.probs[b] && q.ids[a] < q.ids[b]);
    });
    for (size_t i = 0; i < kk; ++i) c.emplace_back(q.ids[idx[i]], std::log(q.probs[idx[i]]));
  }
  return c;
}

}  // namespace

// Depth 1: the topk candidates of the extend's last row. Steps 2..N: the (up to) topk best nodes of the
// previous depth by cumulative draft log-probability (the frontier) each run one MTP row -- fed the node's
// token and the MTP output hidden state of the row that proposed it, at position L + depth - 1 (L = the last
// token's position), in MTP KV slot L + e (e: the expansion's index, e < 64), attending to the MTP context
// [0, L) and its expanded ancestors (tree mask) -- and propose its topk children. Finally the best
// draft_rows(N) nodes overall are kept (a node never outranks its parent: scores only decrease along a path,
// ties go to the earlier node, so the kept set is ancestor-closed), in creation order (topological).
Status Drafter::draft_tree(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& root_rows,
                           const std::vector<int32_t>& root_hidden, const ExecOutput& out, int32_t n_steps) {
  const int64_t V = executor_.vocab_size();
  const int32_t K = config_.topk;
  struct Node {
    int32_t token;
    int32_t parent;      // node index, -1: the root
    int32_t depth;
    double score;        // cumulative draft log-probability
    int32_t src_row;     // row of the MTP output that proposed it (in the latest hidden tensor)
    uint64_t exp_mask;   // expansion bits of its expanded ancestors and itself (once expanded)
  };
  struct Tree {
    Sequence* seq;
    std::vector<Node> nodes;
    std::vector<int32_t> frontier;  // nodes to expand next step
    int32_t n_exp = 0;              // expansions so far
  };
  auto path_to = [](const Tree& t, int32_t node) {  // tokens root -> node (inclusive)
    std::vector<int32_t> path;
    for (int32_t a = node; a >= 0; a = t.nodes[a].parent) path.push_back(t.nodes[a].token);
    std::reverse(path.begin(), path.end());
    return path;
  };
  auto add_children = [&](Tree& t, int32_t parent, std::span<const float> lr, int32_t src_row) {
    const double base = parent < 0 ? 0.0 : t.nodes[parent].score;
    const int32_t depth = parent < 0 ? 1 : t.nodes[parent].depth + 1;
    for (const auto& [tok, lp] : top_candidates(*t.seq, lr, path_to(t, parent), K))
      t.nodes.push_back({tok, parent, depth, base + lp, src_row, 0});
  };
  auto best_of = [&](const Tree& t, std::vector<int32_t> cand, size_t n) {
    std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) {
      return t.nodes[a].score > t.nodes[b].score || (t.nodes[a].score == t.nodes[b].score && a < b);
    });
    if (cand.size() > n) cand.resize(n);
    return cand;
  };
  std::vector<Tree> trees;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Tree t{seqs[i], {}, {}, 0};
    std::span<const float> lr(out.logits.data<float>() + static_cast<int64_t>(root_rows[i]) * V, V);
    add_children(t, -1, lr, root_hidden[i]);
    std::vector<int32_t> all(t.nodes.size());
    std::iota(all.begin(), all.end(), 0);
    t.frontier = best_of(t, all, K);
    trees.push_back(std::move(t));
  }
  Tensor hidden = out.hidden;
  for (int32_t j = 2; j <= n_steps; ++j) {
    model::ForwardBatch d;
    d.want_hidden = true;
    d.want_host_logits = true;
    std::vector<int32_t> hrows;
    std::vector<std::pair<size_t, int32_t>> row_node;  // batch row -> (tree, node expanded)
    for (size_t ti = 0; ti < trees.size(); ++ti) {
      Tree& t = trees[ti];
      if (t.frontier.empty()) continue;
      Sequence* seq = t.seq;
      const int32_t L = static_cast<int32_t>(seq->tokens.size()) - 1;
      model::SequenceSpan span = table_span(*seq);
      span.token_begin = d.n_tokens();
      span.n_tokens = static_cast<int32_t>(t.frontier.size());
      span.tree_base = L;
      for (int32_t f : t.frontier) {
        Node& n = t.nodes[f];
        const int32_t e = t.n_exp++;
        n.exp_mask = (n.parent < 0 ? 0 : t.nodes[n.parent].exp_mask) | (uint64_t{1} << e);
        d.token_ids.push_back(n.token);
        d.positions.push_back(L + n.depth - 1);
        span.kv_indices.push_back(L + e);
        span.tree_mask.push_back(n.exp_mask);
        hrows.push_back(n.src_row);
        row_node.emplace_back(ti, f);
      }
      span.kv_len = L + t.n_exp;
      d.seqs.push_back(std::move(span));
    }
    if (d.token_ids.empty()) break;
    for (size_t r = 0; r < row_node.size(); ++r) d.logit_rows.push_back(static_cast<int32_t>(r));
    Tensor hd = executor_.select_rows(hidden, hrows);
    MX_ASSIGN_OR_RETURN(ExecOutput step, executor_.execute_mtp(d, hd));
    std::vector<std::vector<int32_t>> fresh(trees.size());
    for (size_t r = 0; r < row_node.size(); ++r) {
      auto [ti, f] = row_node[r];
      Tree& t = trees[ti];
      const size_t before = t.nodes.size();
      std::span<const float> lr(step.logits.data<float>() + static_cast<int64_t>(r) * V, V);
      add_children(t, f, lr, static_cast<int32_t>(r));
      for (size_t c = before; c < t.nodes.size(); ++c) fresh[ti].push_back(static_cast<int32_t>(c));
    }
    for (size_t ti = 0; ti < trees.size(); ++ti) trees[ti].frontier = best_of(trees[ti], fresh[ti], K);
    hidden = step.hidden;
  }
  const int32_t keep = config_.draft_rows(n_steps);
  for (Tree& t : trees) {
    std::vector<int32_t> all(t.nodes.size());
    std::iota(all.begin(), all.end(), 0);
    std::vector<int32_t> kept = best_of(t, all, static_cast<size_t>(keep));
    std::sort(kept.begin(), kept.end());  // creation order: parents first
    std::vector<int32_t> new_index(t.nodes.size(), -1);
    Sequence* seq = t.seq;
    seq->clear_drafts();
    for (size_t i = 0; i < kept.size(); ++i) {
      const Node& n = t.nodes[kept[i]];
      new_index[kept[i]] = static_cast<int32_t>(i);
      const int32_t parent = n.parent < 0 ? -1 : new_index[n.parent];
      MX_CHECK_MSG(n.parent < 0 || parent >= 0, "draft tree: a kept node's parent was pruned");
      seq->drafts.push_back(n.token);
      seq->draft_parents.push_back(parent);
    }
  }
  return Status::ok();
}

}  // namespace mxserve::runtime
