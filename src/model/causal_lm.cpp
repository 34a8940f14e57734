#include "model/causal_lm.h"

#include "core/logging.h"
#include "io/checkpoint.h"
#include "model/archs/glm4_moe.h"

namespace mxserve::model {

Result<std::unique_ptr<CausalLM>> load_causal_lm(const std::string& dir, backend::Backend& be,
                                                 const LoadOptions& options) {
  MX_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(dir));
  const bool mtp = options.load_mtp && cfg.n_mtp_layers > 0;
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
