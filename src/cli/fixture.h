// Golden fixtures (the format: docs/fixtures.md): reading reference.safetensors and checking a model against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/causal_lm.h"

namespace mxserve::cli {

struct FixtureCase {
  std::vector<int32_t> input_ids;   // [T]
  Tensor logits;                    // f32 [T, V]
  std::vector<int32_t> greedy;      // [N]
  Tensor mtp_logits;                // f32 [T-1, V] (undefined when absent)
  bool has_mtp = false;
};

// Reads every case.{i}.* from DIR/reference.safetensors (contiguous i from 0), validating shapes.
Result<std::vector<FixtureCase>> read_fixture_cases(const std::string& dir, int64_t vocab_size);

struct FixtureReport {
  int cases = 0;
  int failures = 0;
  // Decision-aware mode, over every path and case (cli/fixture_decisions.h).
  int64_t decision_rows = 0;
  int decision_flips = 0, decision_beyond_bound = 0;
  int greedy_flips = 0, greedy_beyond_bound = 0;
  double max_bound_use = 0;
};

struct FixtureOptions {
  double max_rel_l2 = 1e-4;
  int64_t block_size = 16;
  int64_t chunk_size = 7;  // prefill chunk for the through-the-cache check (exercises block boundaries)
  // Decision-aware checks (cli/fixture_decisions.h), for bf16 backends: needs the fixture loaded on the CPU
  // backend as the reference. Every check runs with the reference's routing / index decisions forced; the
  // model's own decisions and greedy tokens are judged by the activation format's bound (unit_roundoff).
  bool decision_aware = false;
  model::CausalLM* reference = nullptr;
  backend::Backend* reference_backend = nullptr;
  double unit_roundoff = 1.0 / 256.0;  // model::kBf16UnitRoundoff: bf16 activations
};

// Runs every check, printing one line per case and check; failures counted in the report.
Result<FixtureReport> verify_fixture(const std::string& dir, backend::Backend& be, const FixtureOptions& options);
// The same checks on a model already loaded (e.g. by launch::launch_model) from the fixture at dir.
Result<FixtureReport> verify_fixture_model(const std::string& dir, model::CausalLM& model, backend::Backend& be,
                                           const FixtureOptions& options);

// ||a - b|| / ||b|| and max |a - b| over two f32 tensors of equal numel.
struct ErrorStats {
  double rel_l2 = 0;
  double max_abs = 0;
};
ErrorStats compare(const float* a, const float* b, int64_t n);

}  // namespace mxserve::cli
