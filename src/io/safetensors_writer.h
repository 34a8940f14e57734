// Writes .safetensors files (header + tensor bytes, 8-byte aligned header). Used by tests, the fuzzer
// and (later) `mxserve quantize`. Tensors must be host-resident and contiguous.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::io {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The full file image in memory (header length, header JSON, data).
std::string safetensors_image(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
Status write_safetensors(const std::string& path, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace mxserve::io
