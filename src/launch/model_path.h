// What is wrong with a --model path, said before anything is loaded: a missing directory (with the checkpoint
// directories next to it), a Hugging Face hub id (weights must be downloaded first, and how), a file where a
// directory is expected (config.json, a .safetensors shard), a directory without config.json (a hub cache entry,
// a parent of checkpoints), or config.json without safetensors weights. OK means the directory holds config.json
// and model.safetensors or model.safetensors.index.json; the tokenizer is not checked here (it is blamed only
// once the weights are known to be there).
#pragma once

#include <string>

#include "core/status.h"

namespace mxserve::launch {

// flag: how the user gave the path ("--model"), for the message.
Status check_model_path(const std::string& path, const std::string& flag = "--model");

// "org/name" with no such local path: the shape of a Hugging Face hub id.
bool looks_like_hub_id(const std::string& path);

}  // namespace mxserve::launch
