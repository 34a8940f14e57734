// Engine::extend_and_draft: the MTP (NextN) draft stage of speculative decoding, chain mode.
//   1. extend: the MTP layer runs over every position p the target just computed, with token x_{p+1}
//      and the target's post-norm hidden state h_p (its own KV layer, the target's positions), so its
//      KV stays caught up; the last row of a decoding sequence proposes draft d_1;
//   2. draft: N-1 more MTP steps, each fed the previous draft token and the MTP layer's own output
//      hidden state, propose d_2..d_N. Their KV writes are tentative: the next extend rewrites them.
// The target verifies [x_last, d_1..d_N] in the next step (engine_step.cpp).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

int32_t pick_draft(const TokenDistribution& q, const Sequence& seq, uint64_t counter) {
  if (seq.sampling.temperature <= 0.f) return q.argmax();
  const uint64_t seed = seq.sampling.seed.value_or(seq.seed) ^ 0xD1D1D1D1ull;
  return q.draw(counter_uniform(seed, counter));
}

}  // namespace

Status Engine::extend_and_draft(const std::vector<MtpRows>& all_rows, const Tensor& target_hidden) {
  // N for the next step first: with N = 0 (paused) the extend only keeps the draft KV caught up and
  // skips the MTP head (at GLM-4.5-Air a 1.2 GB read per step).
  int64_t n_decoding = 0;
  for (const MtpRows& r : all_rows) n_decoding += r.seq->n_remaining() == 1;
  const int64_t budget = config_.scheduler.max_num_batched_tokens;
  const int32_t n_steps = spec_policy_.steps_for(n_decoding, budget);
  spec_last_n_ = n_steps;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.spec.current_steps = n_steps;
  }
  // Never slower: when the adaptive policy pauses speculation (not merely the token budget), decoding
  // sequences stop paying for the MTP layer at all. Their draft KV goes stale, so they decode plainly to the
  // end; prefilling sequences keep theirs current, so the policy can re-measure N > 0 on new requests.
  std::vector<MtpRows> kept;
  // (A re-measurement of N = 0 keeps the extend: the sequences must stay able to draft.)
  const bool paused = n_steps == 0 && config_.spec.adaptive && !spec_policy_.exploring() && n_decoding > 0 &&
                      2 * n_decoding <= budget;
  if (paused)
    for (const MtpRows& r : all_rows)
      if (r.seq->n_remaining() != 1) kept.push_back(r);
  const std::vector<MtpRows>& rows = paused ? kept : all_rows;
  if (rows.empty()) return Status::ok();
  model::ForwardBatch ext;
  ext.want_hidden = true;
  std::vector<int32_t> hidden_rows;
  std::vector<size_t> decoding;  // indices into rows whose sequence proposes drafts
  for (size_t i = 0; i < rows.size(); ++i) {
    const MtpRows& r = rows[i];
    Sequence* seq = r.seq;
    model::SequenceSpan span;
    span.token_begin = ext.n_tokens();
    span.n_tokens = r.last_pos - r.first_pos + 1;
    span.kv_len = r.last_pos + 1;
    span.block_table = seq->block_table;
    for (int32_t p = r.first_pos; p <= r.last_pos; ++p) {
      ext.token_ids.push_back(seq->tokens[p + 1]);
      ext.positions.push_back(p);
      hidden_rows.push_back(r.rows.empty() ? r.first_row + (p - r.first_pos) : r.rows[p - r.first_pos]);
    }
    if (seq->n_remaining() == 1 && n_steps > 0) {  // prefill done: propose drafts for the next step
      ext.logit_rows.push_back(span.token_begin + span.n_tokens - 1);
      decoding.push_back(i);
    }
    ext.seqs.push_back(std::move(span));
  }
  ext.want_host_logits = config_.spec.tree() && !decoding.empty();  // trees rank top-k candidates on the host
  for (size_t k : decoding)
    if (rows[k].seq->sampling.temperature > 0.f) ext.want_host_logits = true;
  // At N = 0 the extend only keeps the draft KV current: time it so the policy learns plain decoding's cost.
  const bool time_extend = n_steps == 0 && config_.spec.adaptive;
  if (time_extend) executor_->synchronize();  // the target's forward is not the extend's
  const auto ext_t1 = Clock::now();
  Tensor h_in = executor_->select_rows(target_hidden, hidden_rows);
  MX_ASSIGN_OR_RETURN(ExecOutput out, executor_->execute_mtp(ext, h_in));
  if (time_extend) {
    executor_->synchronize();
    spec_extend_seconds_ = std::chrono::duration<double>(Clock::now() - ext_t1).count();
  }
  for (const MtpRows& r : rows) r.seq->n_draft_computed = r.last_pos + 1;

  if (n_steps == 0 || decoding.empty()) return Status::ok();

  if (config_.spec.tree()) {
    std::vector<Sequence*> tree_seqs;
    std::vector<int32_t> root_rows, root_hidden;
    const int32_t nodes = config_.spec.draft_rows(n_steps);
    const int32_t expansions = (n_steps - 1) * config_.spec.topk;
    for (size_t k = 0; k < decoding.size(); ++k) {
      Sequence* seq = rows[decoding[k]].seq;
      // Room for the tree's KV (target: x_last + nodes; MTP layer: one slot per expanded node).
      if (!scheduler_.reserve(seq, static_cast<int64_t>(seq->tokens.size()) + std::max(nodes, expansions - 1)))
        continue;
      tree_seqs.push_back(seq);
      root_rows.push_back(static_cast<int32_t>(k));
      const auto& span = ext.seqs[decoding[k]];
      root_hidden.push_back(span.token_begin + span.n_tokens - 1);
    }
    if (tree_seqs.empty()) return Status::ok();
    return draft_tree(tree_seqs, root_rows, root_hidden, out, n_steps);
  }

  const int64_t V = executor_->vocab_size();
  struct Drafting {
    Sequence* seq;
    int32_t hidden_row;  // row of the sequence's latest MTP output in the latest hidden tensor
  };
  std::vector<Drafting> active;
  for (size_t k = 0; k < decoding.size(); ++k) {
    const MtpRows& r = rows[decoding[k]];
    Sequence* seq = r.seq;
    // Room for the drafts' KV now and for verifying them next step; no room -> plain decoding.
    if (!scheduler_.reserve(seq, static_cast<int64_t>(seq->tokens.size()) + n_steps)) continue;
    if (seq->sampling.temperature <= 0.f) {
      seq->drafts = {out.greedy_token(static_cast<int64_t>(k))};
    } else {
      std::span<const float> lr(out.logits.data<float>() + k * V, V);
      TokenDistribution q = sampling_distribution(lr, seq->sampling);
      seq->drafts = {pick_draft(q, *seq, static_cast<uint64_t>(seq->n_generated()) * 64)};
      seq->draft_q = {std::move(q)};
    }
    const auto& span = ext.seqs[decoding[k]];
    active.push_back({seq, span.token_begin + span.n_tokens - 1});
  }
  Tensor hidden = out.hidden;
  for (int32_t j = 2; j <= n_steps && !active.empty(); ++j) {
    model::ForwardBatch d;
    d.want_hidden = true;
    d.want_host_logits = false;
    for (const Drafting& a : active)
      if (a.seq->sampling.temperature > 0.f) d.want_host_logits = true;
    std::vector<int32_t> hrows;
    for (size_t a = 0; a < active.size(); ++a) {
      Sequence* seq = active[a].seq;
      const int32_t pos = static_cast<int32_t>(seq->tokens.size()) - 3 + j;  // draft d_{j-1} sits here
      model::SequenceSpan span;
      span.token_begin = static_cast<int32_t>(a);
      span.n_tokens = 1;
      span.kv_len = pos + 1;
      span.block_table = seq->block_table;
      d.seqs.push_back(std::move(span));
      d.token_ids.push_back(seq->drafts.back());
      d.positions.push_back(pos);
      d.logit_rows.push_back(static_cast<int32_t>(a));
      hrows.push_back(active[a].hidden_row);
    }
    Tensor hd = executor_->select_rows(hidden, hrows);
    MX_ASSIGN_OR_RETURN(ExecOutput step, executor_->execute_mtp(d, hd));
    for (size_t a = 0; a < active.size(); ++a) {
      Sequence* seq = active[a].seq;
      if (seq->sampling.temperature <= 0.f) {
        seq->drafts.push_back(step.greedy_token(static_cast<int64_t>(a)));
      } else {
        std::span<const float> lr(step.logits.data<float>() + a * V, V);
        TokenDistribution q = sampling_distribution(lr, seq->sampling);
        seq->drafts.push_back(pick_draft(q, *seq, static_cast<uint64_t>(seq->n_generated()) * 64 + j));
        seq->draft_q.push_back(std::move(q));
      }
      active[a].hidden_row = static_cast<int32_t>(a);
    }
    hidden = step.hidden;
  }
  return Status::ok();
}

}  // namespace mxserve::runtime

namespace mxserve::runtime {
namespace {

// The k most likely candidates of a draft row with their log-probabilities, best first (ties: lower id).
// Greedy requests rank the raw logits (log-softmax); sampled ones their processed distribution q, so
// every candidate is one the request could sample.
std::vector<std::pair<int32_t, double>> top_candidates(std::span<const float> lr, const SamplingParams& sp, int32_t k) {
  std::vector<std::pair<int32_t, double>> c;
  if (sp.temperature <= 0.f) {
    const int64_t V = static_cast<int64_t>(lr.size());
    const float mx = *std::max_element(lr.begin(), lr.end());
    double z = 0;
    for (float x : lr) z += std::exp(static_cast<double>(x - mx));
    const double lz = std::log(z);
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t kk = std::min<int64_t>(k, V);
    auto better = [&](int32_t a, int32_t b) { return lr[a] > lr[b] || (lr[a] == lr[b] && a < b); };
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), better);
    for (int64_t i = 0; i < kk; ++i) c.emplace_back(idx[i], static_cast<double>(lr[idx[i]] - mx) - lz);
  } else {
    const TokenDistribution q = sampling_distribution(lr, sp);
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

// Tree drafting (EAGLE-2 style). Depth 1: the topk candidates of the extend's last row. Steps 2..N: the
// (up to) topk best nodes of the previous depth by cumulative draft log-probability (the frontier) each
// run one MTP row -- fed the node's token and the MTP output hidden state of the row that proposed it, at
// position L + depth - 1 (L = the last token's position), in MTP KV slot L + e (e: the expansion's index,
// e < 64), attending to the MTP context [0, L) and its expanded ancestors (tree mask) -- and propose its
// topk children. Finally the best draft_rows(N) nodes overall are kept (a node never outranks its parent:
// scores only decrease along a path, ties go to the earlier node, so the kept set is ancestor-closed),
// in creation order (topological). Their MTP KV writes are tentative: the next extend rewrites [L, ...).
Status Engine::draft_tree(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& root_rows,
                          const std::vector<int32_t>& root_hidden, const ExecOutput& out, int32_t n_steps) {
  const int64_t V = executor_->vocab_size();
  const int32_t K = config_.spec.topk;
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
  auto add_children = [&](Tree& t, int32_t parent, std::span<const float> lr, int32_t src_row) {
    const double base = parent < 0 ? 0.0 : t.nodes[parent].score;
    const int32_t depth = parent < 0 ? 1 : t.nodes[parent].depth + 1;
    for (const auto& [tok, lp] : top_candidates(lr, t.seq->sampling, K))
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
      model::SequenceSpan span;
      span.token_begin = d.n_tokens();
      span.n_tokens = static_cast<int32_t>(t.frontier.size());
      span.tree_base = L;
      span.block_table = seq->block_table;
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
    Tensor hd = executor_->select_rows(hidden, hrows);
    MX_ASSIGN_OR_RETURN(ExecOutput step, executor_->execute_mtp(d, hd));
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
  const int32_t keep = config_.spec.draft_rows(n_steps);
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
