// transformers 5.x fused routed-expert layout, unfused: transformers keeps a layer's experts in two stacked
// tensors (no ".weight" suffix), FP8 ones with a stacked block-scale grid:
//   P.gate_up_proj [E, 2I, H] (+ P.gate_up_proj_scale_inv f32 [E, 2I/br, ceil(H/bc)])   gate rows [0, I), up [I, 2I)
//   P.down_proj    [E, H, I]  (+ P.down_proj_scale_inv    f32 [E, ceil(H/br), ceil(I/bc)])
// (P = "model.layers.L.mlp.experts"; float f32|bf16|f16 or float8_e4m3fn). This file presents one expert's
// `P.E.{gate,up,down}_proj.weight` as a StoredWeight of the same precision holding that expert's rows
// (a view of the mapped file: binding copies nothing, so a rank reads only the experts / slices it loads), so the binder and loader treat the fused layout like per-expert checkpoints. Bit-exact: no
// requantization. Invariant: an FP8 gate/up split must fall on a block-row boundary (br divides I), else it
// is an error naming the tensor (a block would straddle gate and up).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "quant/detect.h"
#include "quant/weight_format.h"

namespace mxserve::quant {

struct HfFusedSlice {
  StoredWeight weight;                // the expert's rows
  std::vector<std::string> consumed;  // the fused tensors it came from (data + scale)
};

// weight_name: "P.E.gate_proj.weight" / "P.E.up_proj.weight" / "P.E.down_proj.weight". nullopt when the
// checkpoint has no fused tensor for P (the caller then reports the weight missing); an error when it has
// one but it is malformed or E is out of range. opts: the FP8 block size (quantization_config).
Result<std::optional<HfFusedSlice>> hf_fused_expert_slice(const io::Checkpoint& ckpt, const std::string& weight_name,
                                                          const DetectOptions& opts);

}  // namespace mxserve::quant
