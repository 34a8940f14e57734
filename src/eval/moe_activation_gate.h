// The start-up accuracy gate of W4A8 (`--moe-activation-dtype fp8_e4m3`, issue 18): the same built-in prompts are
// run through the loaded model twice on its backend, once with bf16 MoE activations (the reference) and once
// with FP8 e4m3 activations, and the last-position logits are compared (relative L2, KL, top-1 agreement).
// The batch is large enough (kGateTokens tokens in one forward) that the MoE GEMMs run in the prefill buckets,
// where the wgmma kernels -- the only ones with an FP8-activation form -- are chosen. The gate decides: within
// its bounds the server keeps FP8 activations (one info line); beyond them, or when nothing changed (the FP8
// path never ran: e.g. no wgmma kernel in this shape's plan), it falls back to bf16 activations with one loud
// warning naming the measured values, the bounds and what to do. Invariant: after apply_moe_activation_gate()
// the backend runs exactly the options of the returned decision. docs/quant.md, docs/perf/prefill.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "eval/logit_metrics.h"
#include "model/causal_lm.h"

namespace mxserve::eval {

struct MoeActivationGateReport {
  int64_t prompts = 0, prompt_len = 0;
  LogitComparison cmp;  // reference (bf16 activations) vs candidate (FP8), one row per prompt
  double seconds = 0;
  // Bounds of a healthy W4A8 path: FP8 activations cost a few % of relative logit error (measured figures in
  // docs/perf/prefill.md); far beyond that is a broken kernel or scale, not rounding.
  static constexpr double kMaxRelL2 = 0.15;
  static constexpr double kMaxMeanKl = 0.05;
  bool unchanged() const { return cmp.diff_sq == 0; }  // the candidate options changed nothing
  bool healthy() const { return !unchanged() && cmp.rel_l2() <= kMaxRelL2 && cmp.mean_kl() <= kMaxMeanKl; }
};

// Prompts of the gate for a vocabulary of `vocab`: `n` sequences of `len` ids, each a 64-token pseudo-random
// phrase repeated (induction makes a trained model's continuation confident, so top-1 agreement means something).
std::vector<std::vector<int32_t>> moe_activation_gate_prompts(int64_t vocab, int64_t n, int64_t len);

// Runs the prompts (one batch) with `reference` then `candidate` kernel options on `be` and compares the last
// rows' logits. Leaves `candidate` set on the backend. Errors: the backend refuses an option, a forward fails.
Result<MoeActivationGateReport> compare_kernel_options(model::CausalLM& m, backend::Backend& be,
                                                       const backend::KernelOptions& reference,
                                                       const backend::KernelOptions& candidate,
                                                       int64_t n_prompts = 8, int64_t prompt_len = 512);

// The log text; *warn: log it as a warning (unhealthy or unchanged: the server falls back to bf16 activations).
std::string moe_activation_gate_message(const MoeActivationGateReport& r, bool* warn);

// What serving runs with after the gate.
struct MoeActivationGateDecision {
  bool keep_fp8 = false;            // healthy: the candidate (FP8 activations) stays
  backend::KernelOptions options;   // the candidate, or the reference (bf16 activations) when falling back
  std::string message;              // the one start-up line (moe_activation_gate_message)
  bool warn = false;                // log it as a warning
};

// The decision of a report (pure): keep the candidate iff the report is healthy, else the reference.
MoeActivationGateDecision decide_moe_activation_gate(const MoeActivationGateReport& r,
                                                     const backend::KernelOptions& reference,
                                                     const backend::KernelOptions& candidate);

// Measures (m, be) with `compare` (default: compare_kernel_options at its default size), decides, and sets the
// decided options on `be`: the server's wiring. `requested` is what the flags asked for (FP8 activations);
// the reference is the same options with bf16 activations. Errors: the measurement fails, or the backend
// refuses the decided options.
using KernelOptionsComparer = std::function<Result<MoeActivationGateReport>(
    model::CausalLM&, backend::Backend&, const backend::KernelOptions& reference, const backend::KernelOptions& candidate)>;
Result<MoeActivationGateDecision> apply_moe_activation_gate(model::CausalLM& m, backend::Backend& be,
                                                           const backend::KernelOptions& requested,
                                                           const KernelOptionsComparer& compare = nullptr);

}  // namespace mxserve::eval
