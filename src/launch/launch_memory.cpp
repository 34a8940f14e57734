// plan_kv_budget (launch_memory.h): the dry run of the largest step, the per-device split, the refusals.
#include "launch/launch_memory.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/device_memory.h"
#include "core/device_oom.h"
#include "core/logging.h"
#include "launch/lockstep_model.h"
#include "runtime/engine.h"

namespace mxserve::launch {
namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

// The dry run: n requests of `tokens` prompt tokens (distinct, no shared prefix: the placement spreads them over
// the DP groups) in steps of `rows` rows, each decoding 3 + k tokens (MTP drafts and a full verify as serving
// does), on an engine with a private pool just large enough. Returns a Status when a step cannot run.
// pool_bytes: the bytes of its own KV pool on each rank (allocated inside the measured window; subtracted).
// Afterwards the lockstep model's mirrors of that pool are freed (they would otherwise outlive the dry run).
Status dry_run(LaunchedModel& lm, const KvBudgetRequest& r, int64_t rows, int64_t tokens, int64_t n,
               uint64_t* pool_bytes) {
  runtime::EngineConfig ec;
  ec.scheduler.block_size = r.block_size;
  ec.scheduler.max_num_batched_tokens = std::max<int64_t>(r.max_num_batched_tokens, rows);
  ec.scheduler.chunked_prefill_size = rows;
  ec.scheduler.min_prefill_chunk = std::min<int64_t>(256, rows);
  ec.scheduler.max_running = std::max<int64_t>(ec.scheduler.max_running, n);
  ec.spec = r.spec;
  const int64_t decode = 3 + std::max<int64_t>(r.spec.num_steps, 0);
  ec.max_model_len = tokens + 16 + decode;
  const int64_t per_seq = (ec.max_model_len + r.block_size - 1) / r.block_size + 1;
  ec.n_blocks = per_seq * n + 2;
  *pool_bytes = lm.kv_bytes_per_block(r.block_size) * static_cast<uint64_t>(ec.n_blocks + 1);
  std::unique_ptr<runtime::Engine> engine;
  try {  // its small pool (steps catch their own: the engine fails the requests, below)
    engine = lm.make_engine(ec);
  } catch (const DeviceOutOfMemory& oom) {
    return out_of_memory(std::string("the start-up dry run's KV pool: ") + oom.what());
  }
  std::vector<std::string> errors;
  const int64_t vocab = lm.config().vocab_size;
  for (int64_t g = 0; g < n; ++g) {
    runtime::RequestSpec req;
    for (int64_t i = 0; i < tokens; ++i) req.prompt.push_back(static_cast<int32_t>(1 + (i * 7 + g * 131) % (vocab - 1)));
    req.sampling.temperature = 0;
    req.sampling.max_tokens = decode;
    req.sampling.ignore_eos = true;
    auto id = engine->submit(req, [&errors](const runtime::TokenEvent& ev) {
      if (ev.finish == runtime::FinishReason::kError) errors.push_back(ev.error);
    });
    if (!id.is_ok()) return id.status().with_context("the start-up dry run");
  }
  for (int i = 0; i < 100000 && !engine->idle(); ++i) engine->step();
  engine.reset();
  if (auto* group = dynamic_cast<LockstepModel*>(&lm.model())) group->drop_cache_mirrors();
  if (!errors.empty()) {
    const std::string oom = std::string(status_code_name(StatusCode::kOutOfMemory)) + ": ";
    const bool is_oom = errors.front().rfind(oom, 0) == 0;
    return Status(is_oom ? StatusCode::kOutOfMemory : StatusCode::kInternal,
                  "the start-up dry run failed: " + errors.front().substr(is_oom ? oom.size() : 0));
  }
  return Status::ok();
}

// The process's resident host memory (every rank of this process: they share it), 0 when unknown.
uint64_t host_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &pages, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace

DryRunShape dry_run_shape(const KvBudgetRequest& r) {
  const int64_t k = std::max<int64_t>(r.spec.num_steps, 0);
  const int64_t chunk = std::max<int64_t>(std::min(r.max_num_batched_tokens, r.chunked_prefill_size), 1);
  const int64_t riding = std::max<int64_t>(r.max_num_seqs, 0) * (1 + k);
  // max_model_len: a dry-run sequence also decodes 2 tokens and drafts k (the 16 of slack the pool keeps)
  const int64_t cap = r.max_model_len > 0 ? std::max<int64_t>(r.max_model_len - 16 - k, 1) : INT64_MAX;
  DryRunShape out;
  out.step_rows = std::min({std::max(r.max_num_batched_tokens, chunk), chunk + riding, cap});
  out.step_rows = std::max<int64_t>(out.step_rows, 1);
  out.extra_rows = std::max<int64_t>(out.step_rows - std::min(chunk, cap), 0);
  out.prompt_tokens = std::max<int64_t>(std::min(2 * out.step_rows, cap), 1);
  return out;
}

Result<KvBudget> plan_kv_budget(LaunchedModel& lm, const KvBudgetRequest& r) {
  KvBudget out;
  out.kv_bytes_per_rank = r.kv_bytes_per_rank;
  const int world = lm.world();
  if (!backend::device_memory(lm.rank_backend(0)).known) return out;  // CPU ranks: nothing to measure
  const int dp = lm.layout().dp;
  const DryRunShape shape = dry_run_shape(r);
  const int64_t tokens = shape.step_rows;
  out.profiled_tokens = tokens;

  // A short warm-up first (it makes one-time buffers), then the peaks: each measured run's high-water mark above
  // what was in use before it, less its own KV pool (and its mirrors on the other ranks: the same bytes).
  uint64_t pool_bytes = 0;
  const int64_t warm = std::min<int64_t>(tokens, 16);
  MX_RETURN_IF_ERROR(dry_run(lm, r, warm, warm, dp, &pool_bytes));
  std::vector<uint64_t> base(world), peaks(world, 0);
  for (int k = 0; k < world; ++k) base[k] = backend::device_memory(lm.rank_backend(k)).in_use;
  auto measured = [&](int64_t n, int64_t prompt) -> Status {
    std::vector<uint64_t> before(world);
    for (int k = 0; k < world; ++k) {
      backend::reset_memory_peak(lm.rank_backend(k));
      before[k] = backend::device_memory(lm.rank_backend(k)).in_use;
    }
    MX_RETURN_IF_ERROR(dry_run(lm, r, tokens, prompt, n, &pool_bytes));
    for (int k = 0; k < world; ++k) {
      const uint64_t high = backend::device_memory(lm.rank_backend(k)).peak_in_use;
      const uint64_t above = high > before[k] ? high - before[k] : 0;
      peaks[k] = std::max(peaks[k], above > pool_bytes ? above - pool_bytes : 0);
    }
    return Status::ok();
  };
  if (Status s = measured(dp, shape.prompt_tokens); !s.is_ok())
    return Status(s.code(), s.message() + " (the largest step, " + std::to_string(tokens) +
                                " rows, does not fit next to the weights: lower "
                                "--max-num-batched-tokens / --chunked-prefill-size / --max-num-seqs)");
  // Then the most sequences decoding together: --max-num-seqs verify steps of 1 + k rows each, every row with
  // logits (vocabulary-wide, gathered over the ranks), within the step budget.
  const int64_t verify_rows = 1 + std::max<int64_t>(r.spec.num_steps, 0);
  const int64_t many = std::min<int64_t>(r.max_num_seqs, std::max<int64_t>(tokens / verify_rows, 1));
  if (many > dp) {
    if (Status s = measured(many, std::min<int64_t>(8, shape.prompt_tokens)); !s.is_ok())
      return Status(s.code(), s.message() + " (" + std::to_string(many) + " sequences decoding together, " +
                                  std::to_string(many * verify_rows) + " rows with logits, do not fit next to the "
                                  "weights: lower --max-num-seqs)");
  }
  {  // what the measured peak (the activation reserve each rank keeps out of the KV pool) holds
    std::string what = std::to_string(tokens) + "-row steps (a " + std::to_string(tokens - shape.extra_rows) +
                       "-token prefill chunk";
    if (shape.extra_rows > 0)
      what += " + " + std::to_string(shape.extra_rows) + " decode / verify rows of --max-num-seqs " +
              std::to_string(r.max_num_seqs) + " running sequences";
    what += "), prompts of " + std::to_string(shape.prompt_tokens) + " tokens per DP group (a chunk over an "
            "earlier chunk's KV)";
    if (r.spec.num_steps > 0) what += ", MTP draft + verify of " + std::to_string(r.spec.num_steps) + " step(s)";
    if (many > dp)
      what += ", " + std::to_string(many) + " sequences decoding together (" + std::to_string(many * verify_rows) +
              " rows with logits)";
    if (lm.layout().dp_attention)
      what += ", the DP-attention MoE exchange gathering every DP group's rows (up to " + std::to_string(tokens) +
              " a step: the step budgets count all " + std::to_string(dp) + " groups together)";
    MX_LOG(kInfo) << "start-up dry run: the activation reserve is each rank's measured peak over " << what
                  << "; a GPU shared by several ranks releases every rank's cached blocks before an allocation fails";
  }

  // Per device: the ranks on it, their in-use bytes (weights, buffers), peaks, and the device's own numbers.
  struct Dev {
    std::vector<int> ranks;
    uint64_t in_use = 0, cached = 0, peaks = 0, total = 0, free = 0;
  };
  std::map<int, Dev> devs;
  for (int k = 0; k < world; ++k) {
    const backend::DeviceMemory m = backend::device_memory(lm.rank_backend(k));
    Dev& d = devs[m.device];
    d.ranks.push_back(k);
    d.in_use += m.in_use + m.graph_pool;
    d.cached += m.cached;
    const uint64_t peak = peaks[k];  // the dry runs' own KV pools are no peak
    d.peaks += peak;
    out.peak_activation_bytes = std::max(out.peak_activation_bytes, peak);
    d.total = m.device_total, d.free = m.device_free;
  }
  out.peak_activation_per_rank = peaks;
  for (int k = 0; k < world; ++k) {  // what each rank holds (its weights' share, buffers) and its peak
    const backend::DeviceMemory m = backend::device_memory(lm.rank_backend(k));
    MX_LOG(kInfo) << "rank " << k << "/" << world << " on GPU " << m.device << ": " << gib(static_cast<double>(base[k]))
                  << " in use before the dry run (weights, buffers), forward peak "
                  << gib(static_cast<double>(peaks[k])) << " (its dry-run KV pool excluded)";
  }
  MX_LOG(kInfo) << "host memory: " << gib(static_cast<double>(host_rss_bytes())) << " resident (the process: all "
                << world << " rank(s) of this node)";
  uint64_t kv_per_rank = UINT64_MAX;
  for (const auto& [device, d] : devs) {
    const double n = static_cast<double>(d.ranks.size());
    const double cap = static_cast<double>(d.total) * r.gpu_memory_utilization;
    // Used by anything but a block our allocators could hand out again: weights and buffers in use, CUDA
    // contexts, library workspaces, other processes.
    const double used = static_cast<double>(d.total - d.free) - static_cast<double>(d.cached);
    const double kv_room = cap - used - static_cast<double>(d.peaks);
    MX_LOG(kInfo) << "device memory, GPU " << device << " (" << d.ranks.size() << " rank(s)"
                  << (d.ranks.size() > 1 ? " sharing it" : "") << "): total " << gib(static_cast<double>(d.total))
                  << " x --gpu-memory-utilization " << r.gpu_memory_utilization << " = " << gib(cap)
                  << "; weights + buffers " << gib(static_cast<double>(d.in_use)) << ", other users "
                  << gib(std::max(0.0, used - static_cast<double>(d.in_use))) << ", forward peak "
                  << gib(static_cast<double>(d.peaks) / n) << " per rank (measured at " << tokens
                  << "-row steps); room for KV " << gib(std::max(0.0, kv_room)) << " = "
                  << gib(std::max(0.0, kv_room) / n) << " per rank";
    if (kv_room <= 0)
      return out_of_memory("GPU " + std::to_string(device) + ": the weights and buffers (" +
                           gib(static_cast<double>(d.in_use)) + ") + the forward's peak (" +
                           gib(static_cast<double>(d.peaks)) + " over " + std::to_string(d.ranks.size()) +
                           " rank(s), at " + std::to_string(tokens) + " tokens) + other users leave no room for a KV "
                           "cache in " + gib(cap) + " (--gpu-memory-utilization " +
                           std::to_string(r.gpu_memory_utilization) +
                           "): raise it, lower --max-num-batched-tokens / --chunked-prefill-size, or use more GPUs");
    const uint64_t room_per_rank = static_cast<uint64_t>(kv_room / n);
    if (r.kv_bytes_given && r.kv_bytes_per_rank > room_per_rank)  // named: checked against the cap, never resized
      return out_of_memory("--kv-cache-memory " + gib(static_cast<double>(r.kv_bytes_per_rank)) + " per rank x " +
                           std::to_string(d.ranks.size()) + " rank(s) on GPU " + std::to_string(device) +
                           " does not fit: " + gib(kv_room) + " is left after the weights and the forward's peak (" +
                           gib(static_cast<double>(d.peaks) / n) + " per rank, measured at " + std::to_string(tokens) +
                           " tokens) within --gpu-memory-utilization " + std::to_string(r.gpu_memory_utilization) +
                           ": use --kv-cache-memory <= " + gib(static_cast<double>(room_per_rank)) +
                           ", or lower --max-num-batched-tokens / --chunked-prefill-size");
    kv_per_rank = std::min(kv_per_rank, room_per_rank);
  }
  if (r.utilization_given && !r.kv_bytes_given) {  // sized from the device: each rank the smallest device's share
    out.kv_bytes_per_rank = kv_per_rank;
    MX_LOG(kInfo) << "KV cache budget: " << gib(static_cast<double>(kv_per_rank)) << " per rank (--gpu-memory-utilization "
                  << r.gpu_memory_utilization << ", split among the ranks of each GPU; --kv-cache-memory SIZE sets it "
                  << "instead)";
  } else if (!r.kv_bytes_given && r.kv_bytes_per_rank > kv_per_rank) {
    out.kv_bytes_per_rank = kv_per_rank;  // the default --kv-cache-memory does not fit: said loudly
    MX_LOG(kWarn) << "the default KV cache (" << gib(static_cast<double>(r.kv_bytes_per_rank))
                  << " per rank) does not fit next to the weights and the forward's peak: using "
                  << gib(static_cast<double>(kv_per_rank)) << " per rank (set --kv-cache-memory or "
                  << "--gpu-memory-utilization to choose)";
  }
  // The dry runs' blocks stay cached in each allocator for the forward to reuse; the KV pool's own allocation
  // drops them if it needs the room (CachingAllocator's retry).
  return out;
}

}  // namespace mxserve::launch
