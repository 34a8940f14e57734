#include "model/causal_lm.h"

#include "core/logging.h"
#include "io/checkpoint.h"
#include "core/check.h"
#include "model/layers/weight_loader.h"
#include "model/mtp_presence.h"
#include "model/synthetic_weights.h"

#include <algorithm>
#include <chrono>

namespace mxserve::model {

Result<ModelConfig> resolve_model_config(const std::string& dir, const LoadOptions& options) {
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
  return cfg;
}

DeclaredWeights record_weights(const ArchitectureDef& arch, const ModelConfig& cfg, bool include_mtp) {
  WeightLoader rec = WeightLoader::recording();
  auto built = arch.build(cfg, rec, rec.backend(), include_mtp);
  MX_CHECK_MSG(built.is_ok(), arch.hf_name << ": recording the weight declarations failed: " << built.status().to_string());
  DeclaredWeights d;
  d.table = rec.recorded();
  d.bind.ignored = rec.ignored();
  d.bind.ignored_prefixes = rec.ignored_prefixes();
  d.bind.quant = cfg.quant;
  return d;
}

std::vector<WeightSpec> declared_weights(const ModelConfig& cfg, bool include_mtp) {
  MX_CHECK_MSG(cfg.arch != nullptr, cfg.source << ": no architecture");
  return record_weights(*cfg.arch, cfg, include_mtp).table;
}

Result<std::unique_ptr<CausalLM>> load_causal_lm(const std::string& dir, backend::Backend& be,
                                                 const LoadOptions& options) {
  MX_ASSIGN_OR_RETURN(ModelConfig cfg, resolve_model_config(dir, options));
  const bool mtp = options.load_mtp && cfg.n_mtp_layers > 0;
  const ArchitectureDef& arch = *cfg.arch;
  const DeclaredWeights declared = record_weights(arch, cfg, mtp);
  if (options.synthetic) {
    MX_ASSIGN_OR_RETURN(SyntheticPlan plan, parse_synthetic_plan(options.synthetic_quantization));
    const SyntheticSource src = make_synthetic_source(declared.table, cfg.d_model, options.seed, plan);
    const bool packed = plan.experts == "mxfp4" && be.supports_expert_format(backend::ExpertFormat::kMxfp4);
    MX_LOG(kInfo) << "synthetic weights generated on " << be.name() << " (seed " << options.seed << ", plan "
                  << plan.experts << ":" << plan.rest << ", " << synthetic_weight_bytes(declared.table) / (1 << 20)
                  << " MiB as bf16) for " << describe_config(cfg);
    if (plan.experts != "bf16") {
      MX_LOG(kInfo) << "synthetic routed experts: " << plan.experts
                    << (packed ? " stored packed on the device"
                               : " values, dequantized on load (this backend runs float experts)");
    }
    const auto t0 = std::chrono::steady_clock::now();
    WeightLoader wl(be, src);
    wl.set_rank(options.rank, options.comm, options.moe_comm);
    wl.set_fused_add_norm(options.fused_add_norm);
    MX_ASSIGN_OR_RETURN(auto model, arch.build(cfg, wl, be, mtp));
    MX_RETURN_IF_ERROR(model->set_kv_cache_dtype(options.kv_cache_dtype));
    be.synchronize();
    MX_LOG(kInfo) << "rank " << options.rank.rank << "/" << options.rank.world() << ": synthetic weights ready in "
                  << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s, "
                  << wl.stats().backend_bytes / (1 << 20) << " MiB of weights on " << be.name() << " ("
                  << wl.stats().backend_bytes << " B: this rank's slices)";
    return model;
  }
  MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(dir));
  // A checkpoint without the MTP layer (one warning) loads for plain decoding; launch refuses it earlier
  // when speculation needs the layer.
  MX_ASSIGN_OR_RETURN(const bool with_mtp, mtp_layer_present(*ckpt, arch, cfg, mtp, /*require_mtp=*/false));
  const DeclaredWeights bound_table = with_mtp == mtp ? declared : record_weights(arch, cfg, false);
  MX_ASSIGN_OR_RETURN(BoundWeights w, bind_weights(*ckpt, bound_table.table, bound_table.bind));
  MX_LOG(kInfo) << "loading " << describe_config(cfg) << " from " << dir << " (" << w.size() << " tensors, "
                << ckpt->num_files() << " file(s)) onto " << be.name();
  if (cfg.quant && cfg.quant->activations_quantized) {
    MX_LOG(kWarn) << cfg.source << ": quantization_config quantizes input activations too (quant_method "
                  << quant::quant_method_name(cfg.quant->method)
                  << "); mxserve dequantizes the weights and keeps activations in full precision (not emulated)";
  }
  const auto t0 = std::chrono::steady_clock::now();
  WeightLoader wl(be, w);
  wl.set_rank(options.rank, options.comm, options.moe_comm);
  wl.set_fused_add_norm(options.fused_add_norm);
  MX_ASSIGN_OR_RETURN(auto model, arch.build(cfg, wl, be, with_mtp));
  MX_RETURN_IF_ERROR(model->set_kv_cache_dtype(options.kv_cache_dtype));
  be.synchronize();
  const WeightLoader::LoadStats& st = wl.stats();  // one line per rank (weight_loader.h: rank-sliced reading)
  MX_LOG(kInfo) << "rank " << options.rank.rank << "/" << options.rank.world() << " loaded: read "
                << st.bytes_read / (1 << 20) << " MiB of the checkpoint (" << st.bytes_read << " B; its share "
                << st.bytes_share << " B, checkpoint " << ckpt->tensor_bytes() << " B, " << st.tensors
                << " tensors), " << st.backend_bytes / (1 << 20) << " MiB of weights on " << be.name() << ", in "
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  return model;
}

}  // namespace mxserve::model
