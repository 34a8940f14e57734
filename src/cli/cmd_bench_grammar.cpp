// `mxserve bench-grammar`: the per-step cost of structured output's token mask (src/structured/) over
// a real tokenizer's vocabulary at a serving batch. Each of the B requests teacher-forces the tokens of
// a valid document (a different offset each, so the batch mixes states: inside strings, keys, numbers,
// structure); every step computes all B masks -- serially (the per-mask latency distribution) and on the
// engine's MaskJobs threads (the step's wall time) -- then advances every request by its next token.
// Every forced token is checked against its mask (the benchmark doubles as a check on real text).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/logging.h"
#include "runtime/constrained_decoding.h"
#include "structured/grammar_constraint.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::cli {
namespace {

using OJ = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

const char* kDefaultSchema = R"({
  "type": "object", "additionalProperties": false,
  "required": ["id", "name", "email", "age", "tags", "address", "active", "bio"],
  "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "email": {"type": "string"},
    "age": {"type": "integer"}, "score": {"type": "number"},
    "tags": {"type": "array", "items": {"enum": ["admin", "editor", "viewer", "guest"]}, "maxItems": 4},
    "address": {"type": "object", "additionalProperties": false, "required": ["street", "city"],
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}}},
    "active": {"type": "boolean"}, "bio": {"type": "string"}
  }})";

const char* kDefaultDoc = R"({"id": 48213, "name": "Zoë Müller-Ramírez", "email": "zoe.muller@example.com",
  "age": 34, "score": 87.25, "tags": ["admin", "viewer"],
  "address": {"street": "1234 Oak Avenue, Apartment 5B", "city": "São Paulo", "zip": "01310-100"},
  "active": true,
  "bio": "Software engineer who writes about distributed systems, compilers and the occasional \"quoted\" remark; likes hiking, chess (rated ~1800) and 日本語の勉強. Previously at a startup building real-time analytics pipelines."})";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int cmd_bench_grammar(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--tokenizer", "--batch", "--steps", "--schema", "--doc", "--vocab-size"}, {});
  if (!args.is_ok()) {
    std::fprintf(stderr, "bench-grammar: %s\n", args.status().to_string().c_str());
    return 2;
  }
  auto tok_dir = args->get("--tokenizer");
  auto batch = args->get_int("--batch", 64);
  auto steps = args->get_int("--steps", 200);
  auto vocab = args->get_int("--vocab-size", 0);
  if (!tok_dir.is_ok() || !batch.is_ok() || !steps.is_ok() || !vocab.is_ok() || *batch < 1 || *steps < 1) {
    std::fprintf(stderr, "usage: mxserve bench-grammar --tokenizer DIR [--batch 64] [--steps 200] [--schema FILE] "
                         "[--doc FILE] [--vocab-size V]\n");
    return 2;
  }
  auto tok = tokenizer::Tokenizer::load_dir(*tok_dir);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "bench-grammar: loading the tokenizer from %s: %s\n", tok_dir->c_str(),
                 tok.status().to_string().c_str());
    return 2;
  }
  const std::string schema_text = args->has("--schema") ? read_file(args->get_or("--schema", "")) : kDefaultSchema;
  const std::string doc_text = args->has("--doc") ? read_file(args->get_or("--doc", "")) : kDefaultDoc;
  const OJ schema = OJ::parse(schema_text, nullptr, false), doc = OJ::parse(doc_text, nullptr, false);
  if (schema.is_discarded() || doc.is_discarded()) {
    std::fprintf(stderr, "bench-grammar: --schema / --doc must hold JSON\n");
    return 2;
  }
  auto grammar = structured::compile_json_schema(schema);
  if (!grammar.is_ok()) {
    std::fprintf(stderr, "bench-grammar: --schema: %s\n", grammar.status().to_string().c_str());
    return 2;
  }
  // The document as a model would write it under this grammar: compact, one space after ':' and ','.
  std::string text = doc.dump();
  std::string spaced;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    spaced += ch;
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == ':' || ch == ',') {
      spaced += ' ';
    }
  }
  auto ids = (*tok)->encode(spaced, false);
  if (!ids.is_ok() || ids->empty()) {
    std::fprintf(stderr, "bench-grammar: cannot tokenize the document\n");
    return 2;
  }
  const int64_t V = *vocab > 0 ? *vocab : (*tok)->vocab_size();
  const auto t0 = Clock::now();
  auto index = structured::TokenIndex::from_tokenizer(**tok, V);
  const double build_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("vocabulary: %lld ids, %lld grammar tokens, %lld trie nodes, index built in %.3f s\n",
              static_cast<long long>(V), static_cast<long long>(index->n_tokens()),
              static_cast<long long>(index->n_trie_nodes()), build_s);
  std::printf("document: %zu bytes, %zu tokens; batch %lld, %lld steps\n", spaced.size(), ids->size(),
              static_cast<long long>(*batch), static_cast<long long>(*steps));

  const size_t n_doc = ids->size();
  const int64_t B = *batch;
  std::vector<std::shared_ptr<structured::GrammarConstraint>> reqs(B);
  std::vector<size_t> pos(B);
  auto reset = [&](int64_t i) { reqs[i] = std::make_shared<structured::GrammarConstraint>(*grammar, index); pos[i] = 0; };
  for (int64_t i = 0; i < B; ++i) {  // spread the batch over the document
    reset(i);
    const size_t skip = static_cast<size_t>(i) * n_doc / static_cast<size_t>(B);
    for (; pos[i] < skip; ++pos[i])
      if (!reqs[i]->accept((*ids)[pos[i]])) {
        std::fprintf(stderr, "bench-grammar: token %zu of the document is not allowed by the schema\n", pos[i]);
        return 1;
      }
  }
  std::vector<uint32_t> mask(static_cast<size_t>(runtime::mask_words(V)));
  std::vector<double> per_mask_us, serial_step_ms, parallel_step_ms, string_us, other_us;
  int64_t allowed_total = 0;
  for (int64_t s = 0; s < *steps; ++s) {
    const auto s0 = Clock::now();
    for (int64_t i = 0; i < B; ++i) {
      const bool in_string = reqs[i]->matcher().string_mode(reqs[i]->matcher().tops()) >= 0;
      const auto m0 = Clock::now();
      reqs[i]->fill_allowed(mask);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - m0).count();
      per_mask_us.push_back(us);
      (in_string ? string_us : other_us).push_back(us);
      const int32_t next = (*ids)[pos[i]];
      if (!runtime::mask_has(mask, next)) {
        std::fprintf(stderr, "bench-grammar: the mask at document token %zu excludes the document's token %d\n",
                     pos[i], next);
        return 1;
      }
      for (uint32_t w : mask) allowed_total += __builtin_popcount(w);
    }
    serial_step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
    runtime::MaskJobs jobs;
    for (int64_t i = 0; i < B; ++i) jobs.add(reqs[i].get());
    const auto p0 = Clock::now();
    jobs.start(V);
    for (int64_t i = 0; i < B; ++i) jobs.get(static_cast<size_t>(i));
    parallel_step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - p0).count());
    for (int64_t i = 0; i < B; ++i) {
      if (!reqs[i]->accept((*ids)[pos[i]])) {
        std::fprintf(stderr, "bench-grammar: accept refused document token %zu\n", pos[i]);
        return 1;
      }
      if (++pos[i] == n_doc) reset(i);
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double t = 0;
    for (double x : v) t += x;
    return v.empty() ? 0.0 : t / static_cast<double>(v.size());
  };
  std::printf("per mask (us): mean %.1f  p50 %.1f  p99 %.1f  max %.1f  (inside strings: mean %.1f over %zu; "
              "elsewhere: mean %.1f over %zu); mean allowed tokens %.0f\n",
              mean(per_mask_us), pct(per_mask_us, 0.5), pct(per_mask_us, 0.99), pct(per_mask_us, 1.0), mean(string_us),
              string_us.size(), mean(other_us), other_us.size(),
              static_cast<double>(allowed_total) / static_cast<double>(per_mask_us.size()));
  std::printf("batch-%lld step (ms): serial mean %.2f p99 %.2f; MaskJobs (%u hw threads) mean %.2f p99 %.2f\n",
              static_cast<long long>(B), mean(serial_step_ms), pct(serial_step_ms, 0.99),
              std::thread::hardware_concurrency(), mean(parallel_step_ms), pct(parallel_step_ms, 0.99));
  OJ out = {{"vocab", V}, {"batch", B}, {"steps", *steps}, {"index_build_s", build_s},
            {"mask_us_mean", mean(per_mask_us)}, {"mask_us_p99", pct(per_mask_us, 0.99)},
            {"step_ms_serial_mean", mean(serial_step_ms)}, {"step_ms_parallel_mean", mean(parallel_step_ms)},
            {"step_ms_parallel_p99", pct(parallel_step_ms, 0.99)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace mxserve::cli
