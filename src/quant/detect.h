// Per-tensor precision detection: looks at a weight's stored dtype and the scale tensors next to it in
// the checkpoint and returns what it is (plain float, MXFP4, FP8 block, FP8 per tensor), validating
// every companion's dtype and shape. Never consults names beyond the "<X>.weight_scale[_inv]" /
// "<X>_blocks" + "<X>_scales" conventions, and never a config (the binder checks configs afterwards).
// Every error names the tensor and says what was expected vs found.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "quant/weight_format.h"

namespace mxserve::quant {

struct DetectOptions {
  int64_t fp8_block_rows = 128;  // from quantization_config.weight_block_size when present
  int64_t fp8_block_cols = 128;
};

// name: the weight's data tensor ("X.weight"), which must exist.
Result<StoredWeight> detect_weight(const io::Checkpoint& ckpt, const std::string& name, const DetectOptions& opts);

// Companion scale names a weight may have ("X.weight_scale", "X.weight_scale_inv").
std::vector<std::string> scale_names_for(const std::string& weight_name);

// gpt-oss fused experts: name ends in "_blocks"; its scales are "<X>_scales".
bool is_gpt_oss_blocks_name(const std::string& name);
Result<StoredWeight> detect_gpt_oss_blocks(const io::Checkpoint& ckpt, const std::string& blocks_name);

}  // namespace mxserve::quant
