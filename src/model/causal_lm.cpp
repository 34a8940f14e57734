#include "model/causal_lm.h"

#include "core/logging.h"
#include "io/checkpoint.h"
#include "model/archs/glm4_moe.h"
#include "model/synthetic_weights.h"

#include <algorithm>

namespace mxserve::model {

Result<std::unique_ptr<CausalLM>> load_causal_lm(const std::string& dir, backend::Backend& be,
                                                 const LoadOptions& options) {
  MX_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  if (!options.synthetic_quantization.empty() && !options.synthetic)
    return invalid_argument("--quantization applies to --synthetic-weights (a checkpoint's precision is read from it)");
  if (options.num_layers_override > 0) {
    if (!options.synthetic)
      return invalid_argument("--num-layers truncates a model and needs --synthetic-weights (a checkpoint's "
                              "layers would not match)");
    if (options.num_layers_override > cfg.n_layers)
      return invalid_argument("--num-layers " + std::to_string(options.num_layers_override) + " exceeds the " +
                              std::to_string(cfg.n_layers) + " layers of " + cfg.source);
    cfg.n_layers = options.num_layers_override;
    cfg.first_k_dense = std::min(cfg.first_k_dense, cfg.n_layers);
  }
  const bool mtp = options.load_mtp && cfg.n_mtp_layers > 0;
  if (options.synthetic) {
    switch (cfg.arch) {
      case Architecture::kGlm4Moe: {
        const auto table = glm4_moe_weight_table(cfg, mtp);
        MX_LOG(kInfo) << "synthetic weights (seed " << options.seed << ", "
                      << synthetic_weight_bytes(table) / (1 << 20) << " MiB bf16) for " << describe_config(cfg)
                      << " onto " << be.name();
        BoundWeights w = make_synthetic_weights(table, cfg.d_model, options.seed);
        MX_RETURN_IF_ERROR(quantize_synthetic_experts(w, options.synthetic_quantization));
        if (!options.synthetic_quantization.empty())
          MX_LOG(kInfo) << "synthetic routed experts stored as " << options.synthetic_quantization
                        << " (dequantized on load: GPU-resident 4-bit weights are issue 9)";
        return make_glm4_moe(cfg, w, be, mtp);
      }
    }
  }
  MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(dir));
  switch (cfg.arch) {
    case Architecture::kGlm4Moe: {
      MX_ASSIGN_OR_RETURN(BoundWeights w,
                          bind_weights(*ckpt, glm4_moe_weight_table(cfg, mtp), glm4_moe_bind_options(cfg, mtp)));
      MX_LOG(kInfo) << "loading " << describe_config(cfg) << " from " << dir << " (" << w.size() << " tensors, "
                    << ckpt->num_files() << " file(s)) onto " << be.name();
      return make_glm4_moe(cfg, w, be, mtp);
    }
  }
  return internal_error("unhandled architecture");
}

}  // namespace mxserve::model
