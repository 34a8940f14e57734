// What the official GLM-5.x FP8 releases (quant_method "fp8", zai-org/GLM-5*-FP8; research/models-formats.md
// 4.7) store outside their quantization_config: two Linear weights are kept bf16 without being listed in
// modules_to_not_convert, so the config alone would call them FP8:
//   *.self_attn.indexer.weights_proj  the release lists it as "self_attn.indexers_proj", a module that does not
//                                     exist; transformers keeps it in fp32 (_keep_in_fp32_modules) and serving
//                                     engines build it unquantized: never quantized under quant_method fp8.
//   *.eh_proj (the MTP layer)          bf16 in GLM-5.x FP8 releases, FP8 when transformers' FineGrainedFP8 converts
//                                     every Linear (tests/data/independent_ckpt/*_fp8_hf): either is accepted.
// Every other weight follows quant_config.h unchanged. Only the binder (model/weight_table.cpp) asks.
#pragma once

#include <string>

#include "quant/quant_config.h"

namespace mxserve::quant {

enum class Fp8ReleaseRule {
  kNone,            // quant_config.h decides
  kNeverQuantized,  // expected unquantized whatever the lists say
  kEither,          // the stored precision is accepted as detected (quantized or not)
};

// module: the checkpoint name without ".weight".
Fp8ReleaseRule fp8_release_rule(const QuantizationConfig& qc, const std::string& module);
// Why (for the binder's messages), e.g. "indexer.weights_proj, which quant_method fp8 never converts (...)".
std::string fp8_release_reason(Fp8ReleaseRule rule);

}  // namespace mxserve::quant
