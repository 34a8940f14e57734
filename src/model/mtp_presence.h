// Whether a checkpoint holds the MTP (NextN) layer its config declares. transformers' save_pretrained drops
// that layer (its Glm4Moe has no MTP module), so such checkpoints are common. Invariant: plain decoding of
// a checkpoint without the layer works, with one warning naming the missing prefix; MTP speculation with
// it missing is an error naming the missing tensors. A layer only partly present is the binder's to report.
#pragma once

#include "core/status.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/registry.h"

namespace mxserve::model {

// false (after one warning) when want_mtp and the checkpoint holds none of the MTP layer's tensors, or an
// error naming them when require_mtp too; true when it holds any of them; want_mtp && cfg declares one
// otherwise.
Result<bool> mtp_layer_present(const io::Checkpoint& ckpt, const ArchitectureDef& arch, const ModelConfig& cfg,
                               bool want_mtp, bool require_mtp);

}  // namespace mxserve::model
