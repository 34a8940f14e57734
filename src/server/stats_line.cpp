#include "server/stats_line.h"

#include <cstdio>

namespace mxserve::server {

std::optional<std::string> StatsLine::update(const runtime::EngineStats& s, const Metrics& m) {
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::max(1e-9, std::chrono::duration<double>(now - last_).count());
  const int64_t prompt = m.prompt_tokens(), generated = m.generation_tokens();
  const int64_t queries = s.scheduler.prefix_queries_tokens, hits = s.scheduler.prefix_hit_tokens;
  const bool idle = s.steps == steps_ && s.running == 0 && s.waiting == 0;
  const double prompt_tps = static_cast<double>(prompt - prompt_) / dt;
  const double gen_tps = static_cast<double>(generated - generated_) / dt;
  const double hit_rate = queries > queries_ ? 100.0 * static_cast<double>(hits - hits_) / static_cast<double>(queries - queries_) : 0.0;
  last_ = now;
  prompt_ = prompt;
  generated_ = generated;
  queries_ = queries;
  hits_ = hits;
  steps_ = s.steps;
  const int64_t drafts = s.spec.num_drafts - drafts_, accepted = s.spec.num_accepted_tokens - accepted_;
  drafts_ = s.spec.num_drafts;
  accepted_ = s.spec.num_accepted_tokens;
  if (idle) return std::nullopt;
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %lld reqs, "
                "Waiting: %lld reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%, Preemptions: %lld",
                prompt_tps, gen_tps, static_cast<long long>(s.running), static_cast<long long>(s.waiting),
                100.0 * kv_cache_usage(s), hit_rate, static_cast<long long>(s.scheduler.preemptions));
  std::string line = buf;
  if (drafts > 0) {
    std::snprintf(buf, sizeof(buf), ", Spec acceptance length: %.2f (N=%d)",
                  1.0 + static_cast<double>(accepted) / static_cast<double>(drafts), s.spec.current_steps);
    line += buf;
  }
  return line;
}

}  // namespace mxserve::server
