// structured_oracle: the C++ half of the grammar oracle test (grammar_oracle.mjs holds the JSON-schema
// validator, ajv). Usage:
//   structured_oracle generate SPEC_FILE N SEED  -> N lines, each a JSON string: a document produced by
//       constrained random decoding over a fragment vocabulary (null when it did not end in 4000 tokens)
//   structured_oracle check SPEC_FILE < lines     -> per input line (a JSON string): 1 if the grammar accepts
//       it as a complete output, else 0
// SPEC_FILE: {"schema": {...}} | {"json_object": true} | {"choice": [...]}.
#include <fstream>
#include <iostream>
#include <random>

#include "test_support.h"

using namespace mxserve;
using namespace mxserve::structured;
using OJ = nlohmann::ordered_json;

namespace {

std::shared_ptr<const Grammar> load(const std::string& path) {
  std::ifstream in(path);
  OJ spec = OJ::parse(in);
  if (spec.contains("json_object")) return any_json_object_grammar();
  if (spec.contains("choice")) {
    auto g = compile_choice(spec["choice"].get<std::vector<std::string>>());
    if (!g.is_ok()) throw std::runtime_error(g.status().to_string());
    return *g;
  }
  auto g = compile_json_schema(spec["schema"]);
  if (!g.is_ok()) throw std::runtime_error(g.status().to_string());
  return *g;
}

bool has_closing_byte(const std::string& s) {
  return s.find_first_of("\"}]") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: structured_oracle generate SPEC N SEED | check SPEC\n";
    return 2;
  }
  const std::string mode = argv[1];
  auto grammar = load(argv[2]);
  if (mode == "check") {
    std::string line;
    while (std::getline(std::cin, line)) {
      const std::string text = OJ::parse(line).get<std::string>();
      Matcher m(grammar);
      std::cout << ((m.accept(text) && m.can_end()) ? 1 : 0) << "\n";
    }
    return 0;
  }
  const int n = std::stoi(argv[3]);
  std::mt19937_64 rng(std::stoull(argv[4]));
  const auto vocab = testing::fragment_vocab();
  auto index = TokenIndex::build(vocab, static_cast<int64_t>(vocab.size()));
  const int32_t eos = static_cast<int32_t>(vocab.size()) - 1;
  std::vector<uint32_t> mask(static_cast<size_t>(index->words()));
  for (int i = 0; i < n; ++i) {
    GrammarConstraint c(grammar, index);
    std::string out;
    bool ended = false;
    for (int step = 0; step < 4000 && !ended; ++step) {
      c.fill_allowed(mask);
      std::vector<int32_t> allowed, closing;
      for (int32_t t = 0; t < eos; ++t)
        if ((mask[t >> 5] >> (t & 31)) & 1u) {
          allowed.push_back(t);
          if (has_closing_byte(*index->bytes(t))) closing.push_back(t);
        }
      const bool complete = c.complete();
      std::uniform_real_distribution<double> u(0, 1);
      if (complete && (allowed.empty() || u(rng) < 0.5)) {
        ended = true;
        break;
      }
      if (allowed.empty()) {
        std::cerr << "dead end after " << OJ(out).dump() << "\n";
        return 1;
      }
      const double close_bias = std::min(0.9, step / 150.0);
      const auto& pool = (!closing.empty() && u(rng) < close_bias) ? closing : allowed;
      const int32_t t = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
      if (!c.accept(t)) {
        std::cerr << "mask allowed token " << t << " but accept refused it after " << OJ(out).dump() << "\n";
        return 1;
      }
      out += *index->bytes(t);
    }
    std::cout << (ended ? OJ(out).dump() : "null") << "\n";  // dump() throws on invalid UTF-8
  }
  return 0;
}
