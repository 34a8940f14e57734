// gpt-oss MXFP4 expert layout, unfused: gpt-oss stores all experts of a layer in two fused tensors
//   P.gate_up_proj_blocks u8 [E, 2I, H/32, 16] + P.gate_up_proj_scales u8 [E, 2I, H/32]
//   P.down_proj_blocks    u8 [E, H, I/32, 16]  + P.down_proj_scales    u8 [E, H, I/32]
// (P = "model.layers.L.mlp.experts"), with gate and up interleaved by row: row 2j is gate_j, row 2j+1
// up_j. This file presents one expert's `P.E.{gate,up,down}_proj.weight` as a StoredWeight of precision
// mxfp4-gptoss holding that expert's rows (copied out, packed [rows, K/2] + scales [rows, K/32]), so the
// binder and loader treat the fused layout like per-expert checkpoints. Bit-exact: no requantization.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "quant/weight_format.h"

namespace mxserve::quant {

struct GptOssSlice {
  StoredWeight weight;                // the expert's rows, precision kMxfp4GptOss
  std::vector<std::string> consumed;  // the fused tensors it came from (blocks + scales)
};

// weight_name: "P.E.gate_proj.weight" / "P.E.up_proj.weight" / "P.E.down_proj.weight". nullopt when the
// checkpoint has no fused tensors for P (the caller then reports the weight missing); an error when it
// has them but they are malformed or E is out of range.
Result<std::optional<GptOssSlice>> gpt_oss_expert_slice(const io::Checkpoint& ckpt, const std::string& weight_name);

}  // namespace mxserve::quant
