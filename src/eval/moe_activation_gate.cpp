#include "eval/moe_activation_gate.h"

#include <chrono>
#include <sstream>

#include "runtime/sequence_runner.h"

namespace mxserve::eval {

std::vector<std::vector<int32_t>> moe_activation_gate_prompts(int64_t vocab, int64_t n, int64_t len) {
  constexpr int64_t kPhrase = 64;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& p : prompts) {
    std::vector<int32_t> phrase;
    for (int64_t i = 0; i < kPhrase; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
      phrase.push_back(static_cast<int32_t>(1 + x % static_cast<uint64_t>(vocab - 1)));  // never token 0
    }
    for (int64_t i = 0; i < len; ++i) p.push_back(phrase[static_cast<size_t>(i % kPhrase)]);
  }
  return prompts;
}

Result<MoeActivationGateReport> compare_kernel_options(model::CausalLM& m, backend::Backend& be,
                                                       const backend::KernelOptions& reference,
                                                       const backend::KernelOptions& candidate, int64_t n_prompts,
                                                       int64_t prompt_len) {
  if (n_prompts < 1 || prompt_len < 1) return invalid_argument("compare_kernel_options: need >= 1 prompt of >= 1 token");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = m.config().vocab_size;
  const auto prompts = moe_activation_gate_prompts(V, n_prompts, prompt_len);
  constexpr int64_t kBlock = 16;
  const int64_t n_blocks = n_prompts * ((prompt_len + kBlock - 1) / kBlock) + 1;
  Tensor logits[2];
  for (int pass = 0; pass < 2; ++pass) {
    MX_RETURN_IF_ERROR(be.set_kernel_options(pass == 0 ? reference : candidate));
    runtime::SequenceRunner runner(m, be, n_blocks, kBlock);  // a private pool, freed after the pass
    std::vector<runtime::SequenceState> states(static_cast<size_t>(n_prompts));
    std::vector<runtime::SequenceState*> seqs;
    for (auto& s : states) seqs.push_back(&s);
    MX_ASSIGN_OR_RETURN(auto step, runner.extend(seqs, prompts, /*all_logits=*/false, /*want_hidden=*/false));
    logits[pass] = std::move(step.logits);  // host f32 [n_prompts, V]
  }
  MoeActivationGateReport r;
  r.prompts = n_prompts;
  r.prompt_len = prompt_len;
  for (int64_t i = 0; i < n_prompts; ++i)
    r.cmp.add_row(logits[0].data<float>() + i * V, logits[1].data<float>() + i * V, V);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string moe_activation_gate_message(const MoeActivationGateReport& r, bool* warn) {
  std::ostringstream o;
  const auto figures = [&] {
    o << "logits rel-L2 " << r.cmp.rel_l2() << ", mean KL " << r.cmp.mean_kl() << " (max " << r.cmp.kl_max
      << "), top-1 agreement " << r.cmp.top1_agree << "/" << r.cmp.tokens << " vs bf16 activations over "
      << r.prompts << " prompts x " << r.prompt_len << " tokens (" << r.seconds << " s)";
  };
  const auto bounds = [&] {
    o << "bounds: rel-L2 <= " << MoeActivationGateReport::kMaxRelL2 << ", mean KL <= "
      << MoeActivationGateReport::kMaxMeanKl;
  };
  *warn = !r.healthy();
  if (r.healthy()) {
    o << "W4A8 accuracy gate passed, serving FP8 MoE activations (--moe-activation-dtype fp8_e4m3): ";
    figures();
    o << "; ";
    bounds();
    return o.str();
  }
  o << "\n*********************************************************************************\n";
  if (r.unchanged()) {
    o << "* W4A8 ACCURACY GATE: FP8 activations changed nothing -- the FP8 path did not run.\n"
      << "* SERVING WITH BF16 MoE ACTIVATIONS INSTEAD (W4A16; --moe-activation-dtype fp8_e4m3 is not in effect).\n"
      << "* FP8 activations apply only where the MXFP4 MoE plan picks a wgmma (wg_*) kernel (prefill buckets on an\n"
      << "* sm_90 GPU, K % 128 == 0); this shape's plan has none at " << r.prompts * r.prompt_len << " tokens.\n"
      << "* To get W4A8: tune this shape (`mxserve tune-moe`) and restart; to silence this: --moe-activation-dtype bf16.\n* ";
  } else {
    o << "* W4A8 ACCURACY GATE FAILED: FP8 activations move the logits far more than rounding does.\n"
      << "* SERVING WITH BF16 MoE ACTIVATIONS INSTEAD (W4A16; --moe-activation-dtype fp8_e4m3 is not in effect).\n* ";
    bounds();
    o << "; measured below. A broken FP8 kernel or scale, not rounding: report it with this line;\n"
      << "* serve with --moe-activation-dtype bf16 to silence this.\n* ";
  }
  figures();
  o << "\n*********************************************************************************";
  return o.str();
}

MoeActivationGateDecision decide_moe_activation_gate(const MoeActivationGateReport& r,
                                                     const backend::KernelOptions& reference,
                                                     const backend::KernelOptions& candidate) {
  MoeActivationGateDecision d;
  d.keep_fp8 = r.healthy();
  d.options = d.keep_fp8 ? candidate : reference;
  d.message = moe_activation_gate_message(r, &d.warn);
  return d;
}

Result<MoeActivationGateDecision> apply_moe_activation_gate(model::CausalLM& m, backend::Backend& be,
                                                           const backend::KernelOptions& requested,
                                                           const KernelOptionsComparer& compare) {
  backend::KernelOptions reference = requested;
  reference.moe_activation_dtype = "bf16";
  auto r = compare ? compare(m, be, reference, requested) : compare_kernel_options(m, be, reference, requested);
  if (!r.is_ok()) return r.status().with_context("W4A8 accuracy gate (--moe-activation-dtype fp8_e4m3)");
  MoeActivationGateDecision d = decide_moe_activation_gate(*r, reference, requested);
  const Status st = be.set_kernel_options(d.options);
  if (!st.is_ok())
    return st.with_context(std::string("W4A8 accuracy gate: setting the decided ") +
                           (d.keep_fp8 ? "FP8" : "bf16") + " activation options");
  return d;
}

}  // namespace mxserve::eval
