// tokenizer_bench: encoding throughput (MB/s, one thread) of mxserve's tokenizer against
// @lenml/tokenizers (node) on the same corpus in the same run, plus 20k-token prompt latency.
// Not a test: run it by hand (see docs/perf/tokenizer.md), ideally pinned to one core:
//   taskset -c 1 build/tests/unit/tokenizer/tokenizer_bench [--reps N] [--no-node]
// Prints a Markdown table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

using mxserve::tokenizer::Tokenizer;
namespace t = mxserve::tokenizer::testing;

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double encode_pass(const Tokenizer& tok, const std::vector<std::string>& corpus, size_t& tokens) {
  double t0 = now_s();
  tokens = 0;
  for (const auto& line : corpus) tokens += tok.encode(line, true)->size();
  return now_s() - t0;
}
}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  bool node = true;
  bool latency_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--no-node")) node = false;
    else if (!std::strcmp(argv[i], "--latency-only")) latency_only = true, node = false, reps = 0;
  }
  std::vector<std::string> corpus = t::load_corpus(t::corpus_path());
  size_t bytes = 0;
  for (const auto& s : corpus) bytes += s.size();
  std::printf("corpus: %zu lines, %.2f MB\n\n", corpus.size(), bytes / 1e6);
  std::printf("| tokenizer | mxserve MB/s (warm cache) | mxserve MB/s (no cache) | @lenml/tokenizers MB/s | ratio (warm) | ratio (no cache) | 20k-token prompt, median ms (no cache / warm) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const char* pkg : {"qwen3", "deepseek_v3", "gptoss", "llama3"}) {
    auto tok = Tokenizer::load(t::tokenizer_json_path(pkg));
    if (!tok.is_ok()) {
      std::fprintf(stderr, "%s: %s\n", pkg, tok.status().to_string().c_str());
      return 1;
    }
    size_t tokens = 0;
    if (!latency_only) encode_pass(**tok, corpus, tokens);  // warm-up (fills the word cache)
    double best_warm = 1e30, best_cold = 1e30;
    for (int r = 0; r < reps; ++r) best_warm = std::min(best_warm, encode_pass(**tok, corpus, tokens));
    (*tok)->set_cache_enabled(false);
    for (int r = 0; r < reps; ++r) best_cold = std::min(best_cold, encode_pass(**tok, corpus, tokens));

    // A ~20k-token prompt from consecutive corpus lines.
    std::string prompt;
    size_t approx = 0;
    for (size_t i = 0; i < corpus.size() && approx < 20000; ++i) {
      prompt += corpus[i];
      prompt += '\n';
      approx += (*tok)->encode(corpus[i] + "\n", true)->size();
    }
    size_t prompt_tokens = (*tok)->encode(prompt, true)->size();
    auto latency = [&](bool cache) {
      (*tok)->set_cache_enabled(cache);
      std::vector<double> ms;
      for (int r = 0; r < (latency_only ? 201 : 21); ++r) {
        double t0 = now_s();
        auto ids = (*tok)->encode(prompt, true);
        ms.push_back((now_s() - t0) * 1e3);
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    double cold_ms = latency(false), warm_ms = latency(true);

    double node_mbs = 0;
    if (node) {
      std::string out = t::run_command("node " + t::source_dir() + "/tools/tokenizer/encode_ref.mjs " + t::node_modules() +
                                       " " + pkg + " " + t::corpus_path() + " --bench");
      auto j = nlohmann::json::parse(out);
      node_mbs = j["bytes"].get<double>() / 1e6 / j["seconds"].get<double>();
    }
    double warm_mbs = bytes / 1e6 / best_warm, cold_mbs = bytes / 1e6 / best_cold;
    std::printf("| %s | %.2f | %.2f | %.2f | %.1fx | %.1fx | %.2f / %.2f (%zu tokens) |\n", pkg, warm_mbs, cold_mbs, node_mbs,
                node ? warm_mbs / node_mbs : 0.0, node ? cold_mbs / node_mbs : 0.0, cold_ms, warm_ms, prompt_tokens);
    std::fflush(stdout);
  }
  return 0;
}
