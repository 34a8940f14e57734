// GLM-5.x FP8 release storage rules outside quantization_config (fp8_release.h).
#include "quant/fp8_release.h"

namespace mxserve::quant {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Fp8ReleaseRule fp8_release_rule(const QuantizationConfig& qc, const std::string& module) {
  if (qc.method != QuantMethod::kFp8) return Fp8ReleaseRule::kNone;
  if (ends_with(module, ".self_attn.indexer.weights_proj")) return Fp8ReleaseRule::kNeverQuantized;
  if (ends_with(module, ".eh_proj") && !qc.excluded_by(module)) return Fp8ReleaseRule::kEither;
  return Fp8ReleaseRule::kNone;
}

std::string fp8_release_reason(Fp8ReleaseRule rule) {
  switch (rule) {
    case Fp8ReleaseRule::kNeverQuantized:
      return "the DSA indexer's weights_proj, which quant_method fp8 never converts (transformers keeps it in fp32; "
             "the GLM-5.x FP8 releases store it bf16 and list it as 'self_attn.indexers_proj')";
    case Fp8ReleaseRule::kEither:
      return "the MTP eh_proj, stored bf16 by the GLM-5.x FP8 releases and FP8 by transformers' FineGrainedFP8";
    case Fp8ReleaseRule::kNone: break;
  }
  return "";
}

}  // namespace mxserve::quant
