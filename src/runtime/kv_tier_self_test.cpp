#include "runtime/kv_tier_self_test.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "runtime/engine.h"
#include "runtime/spec/self_test.h"

namespace mxserve::runtime {
namespace {

// Forwards every call; while recording, keeps the host logits of every target and MTP forward.
class LogitRecorder final : public ModelExecutor {
 public:
  explicit LogitRecorder(std::unique_ptr<ModelExecutor> inner) : inner_(std::move(inner)) {}
  std::vector<float>* target = nullptr;  // null: not recording
  std::vector<float>* mtp = nullptr;

  int64_t vocab_size() const override { return inner_->vocab_size(); }
  Result<ExecOutput> execute(const model::ForwardBatch& b) override {
    if (target == nullptr) return inner_->execute(b);
    model::ForwardBatch all = b;
    all.want_host_logits = true;
    MX_ASSIGN_OR_RETURN(ExecOutput out, inner_->execute(all));
    append(out.logits, target);
    if (!b.want_host_logits) out.logits = Tensor();  // the engine sees what it asked for
    return out;
  }
  Result<std::vector<kernels::SampledRow>> sample(const ExecOutput& o, const kernels::SampleRowsInput& in) override {
    return inner_->sample(o, in);
  }
  bool has_mtp() const override { return inner_->has_mtp(); }
  Result<ExecOutput> execute_mtp(const model::ForwardBatch& b, const Tensor& h) override {
    if (mtp == nullptr) return inner_->execute_mtp(b, h);
    model::ForwardBatch all = b;
    all.want_host_logits = true;
    MX_ASSIGN_OR_RETURN(ExecOutput out, inner_->execute_mtp(all, h));
    append(out.logits, mtp);
    if (!b.want_host_logits) out.logits = Tensor();
    return out;
  }
  Tensor select_rows(const Tensor& h, const std::vector<int32_t>& rows) override { return inner_->select_rows(h, rows); }
  Status enable_block_tables(int64_t rows, int64_t width) override { return inner_->enable_block_tables(rows, width); }
  Status enable_decode_graphs(int64_t max_batch, const SpecGraphShapes& spec = {}) override {
    return inner_->enable_decode_graphs(max_batch, spec);
  }
  int64_t graph_replays() const override { return inner_->graph_replays(); }
  GraphReplayCounts graph_replay_counts() const override { return inner_->graph_replay_counts(); }
  Status check_block_table(int32_t row, uint64_t lease, const std::vector<int32_t>& t) override {
    return inner_->check_block_table(row, lease, t);
  }
  void synchronize() override { inner_->synchronize(); }
  Status copy_kv(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) override {
    return inner_->copy_kv(src, dst);
  }
  Result<kvcache::BlockMover*> enable_host_tier(int64_t n_slots) override { return inner_->enable_host_tier(n_slots); }
  uint64_t kv_bytes_per_block() const override { return inner_->kv_bytes_per_block(); }

 private:
  static void append(const Tensor& logits, std::vector<float>* out) {
    if (logits.ndim() != 2) return;
    out->insert(out->end(), logits.data<float>(), logits.data<float>() + logits.numel());
  }
  std::unique_ptr<ModelExecutor> inner_;
};

struct Served {
  std::vector<int32_t> tokens;
  Usage usage;
  std::vector<float> logits, mtp_logits;
  std::string error;
};

std::string first_difference(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    return std::string(what) + ": " + std::to_string(a.size()) + " values vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      std::ostringstream o;
      o.precision(9);
      o << what << " value " << i << ": " << a[i] << " (device hit) vs " << b[i] << " (host round trip)";
      return o.str();
    }
  return "";
}

}  // namespace

std::string KvTierSelfTestReport::summary() const {
  std::ostringstream o;
  o << "host KV tier self-test: " << prompt_tokens << "-token prompt, " << cached_device
    << " tokens from the device cache vs " << cached_host << " from the host tier (" << offloaded_blocks
    << " blocks offloaded); " << logit_values << " target logits";
  if (mtp_logit_values > 0)
    o << ", " << mtp_logit_values << " MTP logits, accepted " << accepted_device << "/" << drafted_device << " vs "
      << accepted_host << "/" << drafted_host;
  o << (identical ? ": identical" : ": MISMATCH: " + mismatch);
  return o.str();
}

Result<KvTierSelfTestReport> run_kv_tier_self_test(std::unique_ptr<ModelExecutor> executor, int64_t block_size,
                                                   int32_t spec_steps, int32_t max_tokens, int64_t prompt_blocks) {
  if (spec_steps > 0 && !executor->has_mtp())
    return invalid_argument("host KV tier self-test: speculative steps without an MTP layer");
  const uint64_t per_block = executor->kv_bytes_per_block();
  if (per_block == 0) return invalid_argument("host KV tier self-test: the executor has no KV cache layout");
  constexpr int64_t kPoolBlocks = 64;
  const int64_t per_prompt = prompt_blocks + 1 + (max_tokens + 8 + block_size - 1) / block_size;
  if (prompt_blocks <= 0 || 2 * per_prompt > kPoolBlocks)
    return invalid_argument("host KV tier self-test: a " + std::to_string(prompt_blocks) +
                            "-block prompt does not fit twice in its " + std::to_string(kPoolBlocks) + "-block pool");
  // A prompt of whole blocks and a tail (so the device match stops at whole blocks below the last token).
  const int64_t prompt_len = prompt_blocks * block_size + 3;
  std::vector<int32_t> prompt;
  for (const auto& p : spec_self_test_prompts(executor->vocab_size()))
    for (int32_t t : p)
      if (static_cast<int64_t>(prompt.size()) < prompt_len) prompt.push_back(t);
  while (static_cast<int64_t>(prompt.size()) < prompt_len)
    prompt.push_back(static_cast<int32_t>(prompt.size() * 7 % executor->vocab_size()));

  const int64_t executor_vocab = executor->vocab_size();
  EngineConfig cfg;
  cfg.scheduler.block_size = block_size;
  cfg.n_blocks = kPoolBlocks;
  cfg.max_model_len = static_cast<int64_t>(prompt.size()) + max_tokens + 8;
  cfg.kv_cache_host_memory = per_block * static_cast<uint64_t>(2 * cfg.n_blocks);
  cfg.spec.num_steps = spec_steps;
  cfg.spec.adaptive = false;
  auto recorder_owned = std::make_unique<LogitRecorder>(std::move(executor));
  LogitRecorder* recorder = recorder_owned.get();
  Engine engine(cfg, std::move(recorder_owned));

  auto serve = [&](bool record, const std::vector<int32_t>& tokens) -> Result<Served> {
    Served s;
    recorder->target = record ? &s.logits : nullptr;
    recorder->mtp = record ? &s.mtp_logits : nullptr;
    RequestSpec req;
    req.prompt = tokens;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = max_tokens;
    req.sampling.ignore_eos = true;
    MX_ASSIGN_OR_RETURN(RequestId id, engine.submit(req, [&s](const TokenEvent& ev) {
      if (ev.token >= 0) s.tokens.push_back(ev.token);
      if (ev.finish == FinishReason::kError) s.error = ev.error;
      if (ev.finish != FinishReason::kNone) s.usage = ev.usage;
    }));
    (void)id;
    while (!engine.idle()) engine.step();
    recorder->target = recorder->mtp = nullptr;
    if (!s.error.empty()) return internal_error("host KV tier self-test: " + s.error);
    MX_RETURN_IF_ERROR(engine.check_invariants());
    return s;
  };
  // Another prompt of the same length: after the offload it takes the freed device blocks (the pool reuses the
  // most recently freed first) and overwrites every tensor of them, so C's blocks hold only what was copied back.
  std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  for (auto& t : other) t = static_cast<int32_t>((t + 1) % executor_vocab);
  MX_ASSIGN_OR_RETURN(Served a, serve(false, prompt));
  MX_ASSIGN_OR_RETURN(Served b, serve(true, prompt));
  const int64_t host_hits_before = engine.stats().scheduler.prefix_host_hit_tokens;
  KvTierSelfTestReport rep;
  rep.offloaded_blocks = engine.evict_prefix_cache();
  MX_ASSIGN_OR_RETURN(Served d, serve(false, other));
  rep.offloaded_blocks += engine.evict_prefix_cache();
  MX_ASSIGN_OR_RETURN(Served c, serve(true, prompt));
  (void)d;
  const EngineStats st = engine.stats();
  rep.prompt_tokens = static_cast<int64_t>(prompt.size());
  rep.cached_device = b.usage.cached_tokens;
  rep.cached_host = st.scheduler.prefix_host_hit_tokens - host_hits_before;
  rep.logit_values = static_cast<int64_t>(b.logits.size());
  rep.mtp_logit_values = static_cast<int64_t>(b.mtp_logits.size());
  rep.accepted_device = b.usage.spec_accepted_tokens;
  rep.drafted_device = b.usage.spec_draft_tokens;
  rep.accepted_host = c.usage.spec_accepted_tokens;
  rep.drafted_host = c.usage.spec_draft_tokens;
  if (rep.cached_device <= 0 || rep.offloaded_blocks <= 0)
    return internal_error("host KV tier self-test: the prompt was not cached on the device (" +
                          std::to_string(rep.cached_device) + " tokens) or nothing was offloaded");
  std::string diff;
  if (rep.cached_host != rep.cached_device || c.usage.cached_tokens != b.usage.cached_tokens)
    diff = "C was served " + std::to_string(rep.cached_host) + " tokens from the host tier (cached_tokens " +
           std::to_string(c.usage.cached_tokens) + "), B " + std::to_string(rep.cached_device) + " from the device";
  if (diff.empty() && b.tokens != c.tokens) diff = "the generated tokens differ";
  if (diff.empty()) diff = first_difference("target logits", b.logits, c.logits);
  if (diff.empty()) diff = first_difference("MTP logits", b.mtp_logits, c.mtp_logits);
  if (diff.empty() && (rep.accepted_device != rep.accepted_host || rep.drafted_device != rep.drafted_host))
    diff = "speculative acceptance differs";
  if (diff.empty() && b.logits.empty()) diff = "no logits were recorded";
  rep.identical = diff.empty();
  rep.mismatch = diff;
  (void)a;
  return rep;
}

}  // namespace mxserve::runtime
