// mxserve memory: per-GPU weight and KV memory of a layout, and the bytes per token over the links, computed
// from the architecture's weight table (cli/memory_plan.h) -- the numbers docs/parallel.md quotes for GLM-5.2.
#include <cstdio>
#include <set>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/memory_plan.h"
#include "cli/parallel_flags.h"
#include "cli/spec_flags.h"
#include "model/causal_lm.h"
#include "server/serving_model.h"

namespace mxserve::cli {
namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 2;
}

}  // namespace

int cmd_memory(int argc, char** argv) {
  std::set<std::string> value_flags = {"--config", "--model", "--quantization", "--gpu-memory",
                                       "--gpu-memory-utilization", "--kv-cache-dtype", "--num-layers"};
  std::set<std::string> bool_flags = {"--json"};
  value_flags.insert(kParallelValueFlags.begin(), kParallelValueFlags.end());
  bool_flags.insert(kParallelBoolFlags.begin(), kParallelBoolFlags.end());
  value_flags.insert(kSpecValueFlags.begin(), kSpecValueFlags.end());
  bool_flags.insert(kSpecBoolFlags.begin(), kSpecBoolFlags.end());
  auto args = Args::parse(argc, argv, value_flags, bool_flags);
  if (!args.is_ok()) return fail(args.status());
  const Args& a = *args;
  if (!a.positional().empty()) return fail(invalid_argument("unexpected argument '" + a.positional()[0] + "'"));
  if (a.has("--config") == a.has("--model")) return fail(invalid_argument("give exactly one of --config FILE|DIR or --model DIR"));
  const std::string path = a.has("--config") ? a.get_or("--config", "") : a.get_or("--model", "");
  model::LoadOptions lo;
  lo.synthetic = true;  // the config alone: no weights are read
  lo.synthetic_quantization = a.get_or("--quantization", "");
  auto layers = a.get_int("--num-layers", 0);
  if (!layers.is_ok() || *layers < 0) return fail(invalid_argument("--num-layers must be >= 0"));
  lo.num_layers_override = *layers;
  auto plan = model::parse_synthetic_plan(lo.synthetic_quantization);
  if (!plan.is_ok()) return fail(plan.status());
  auto spec = parse_spec_flags(a);
  if (!spec.is_ok()) return fail(spec.status());
  auto parallel = parse_parallel_flags(a);
  if (!parallel.is_ok()) return fail(parallel.status());
  MemoryOptions o;
  o.mtp = spec->num_steps > 0;
  lo.load_mtp = o.mtp;
  auto kv = kvcache::parse_kv_cache_dtype(a.get_or("--kv-cache-dtype", "auto"));
  if (!kv.is_ok()) return fail(kv.status());
  o.kv_dtype = *kv;
  if (a.has("--gpu-memory")) {
    auto bytes = server::parse_byte_size(a.get_or("--gpu-memory", ""));
    if (!bytes.is_ok()) return fail(bytes.status().with_context("--gpu-memory"));
    o.gpu_bytes = *bytes;
  }
  auto util = a.get_double("--gpu-memory-utilization", 0.9);
  if (!util.is_ok() || !(*util > 0 && *util <= 1)) return fail(invalid_argument("--gpu-memory-utilization must be in (0, 1]"));
  o.gpu_utilization = *util;
  auto cfg = model::resolve_model_config(path, lo);
  if (!cfg.is_ok()) return fail(cfg.status());
  auto m = plan_memory(*cfg, *parallel, *plan, o);
  if (!m.is_ok()) return fail(m.status());
  if (a.has("--json")) std::printf("%s\n", memory_plan_json(*m).c_str());
  else std::printf("%s", format_memory_plan(*m, o).c_str());
  return 0;
}

}  // namespace mxserve::cli
