// mxserve bench-model: the real model layer code, timed per layer on a backend with synthetic weights.
// One attention layer (layer 0: input norm, q/k/v, RoPE, KV write, paged attention, o_proj) and one MoE
// layer (the first MoE layer's MLP part: post-attention norm, router, shared expert, routed experts) at
// decode batches x contexts and at prefill chunks; then the truncated model's full decode step (forward +
// lm_head + greedy argmax on the device + the picked ids to the host, as the engine's device sampler does),
// eager and, on CUDA (--cuda-graph, the default there as in `serve`), replayed through the engine's decode
// graphs (cli/bench_model_step.h). Each figure comes with the bytes and FLOPs counted and its fraction of the
// ceilings measured in the same run (CUDA).
// Formulas (elements x their stored bytes; w = weight bytes, a = activation bytes, T tokens). Weight
// element counts are summed from the model's declared weights (model::block_weights), not restated here.
// The attention part's bytes and FLOPs are the architecture's own cost model (ArchitectureDef::attention_cost,
// model/layer_cost.h: GQA in model/archs/glm4_moe.cpp, MLA + DSA in model/archs/glm_moe_dsa.cpp). The rest:
//   MoE bytes       = w (router E H + correction bias E + shared 3 H I_s) + n_hit 3 H I w_e + a T (4 H + K (2 I + H))
//                     n_hit = E (1 - (1 - K/E)^T) (expected experts hit under uniform routing);
//                     w_e = 0.5 + 1/32 for packed MXFP4, else w
//   MoE FLOPs       = 2 T (router + shared Linear params + K x one expert's params = E H + 3 H I_s + K 3 H I)
//   decode step     = all layers' weights (MoE: experts hit at T = batch) + lm_head + KV read; roofline
//                     tok/s = batch / (bytes / copy bandwidth)
// Owns: the command. Does not own: the model code (model/), the ceilings (kernels/cuda/ceilings.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/mla_dsa_ops.h"
#include "cli/args.h"
#include "cli/bench_model_step.h"
#include "cli/commands.h"
#include "cli/graph_flags.h"
#include "core/logging.h"
#include "kvcache/kv_cache.h"
#include "launch/launch.h"
#include "core/check.h"
#include "model/archs/glm_moe_dsa_config.h"
#include "model/causal_lm.h"
#include "model/synthetic_weights.h"
#include "model/weight_stats.h"
#ifdef MXSERVE_HAVE_CUDA
#include "backend/cuda_backend.h"
#include "kernels/cuda/ceilings.h"
#endif

namespace mxserve::cli {
namespace {

int fail(const Status& s, int code = 2) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return code;
}

Result<std::vector<int64_t>> parse_sizes(const Args& a, const std::string& flag, const std::string& fallback) {
  std::vector<int64_t> out;
  std::stringstream ss(a.get_or(flag, fallback));
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) return invalid_argument(flag + ": '" + item + "' is not a positive integer");
    out.push_back(v);
  }
  return out;
}

struct Row {
  std::string part;  // attention | moe | model
  std::string mode;  // decode | prefill | step
  int64_t batch = 0, context = 0, tokens = 0;
  double ms = 0, bytes = 0, flops = 0;
  double tok_s = 0, roofline_tok_s = 0;  // model rows
  std::string path = {};                 // model rows: eager | graph (the engine's CUDA-graph replay)
};

class Timer {
 public:
  explicit Timer(backend::Backend& be) : be_(be) {}
  // Median ms per call of fn over timed regions after warm-up (CUDA events on the CUDA backend).
  double time(const std::function<void()>& fn, int reps) {
#ifdef MXSERVE_HAVE_CUDA
    if (be_.name() == "cuda")
      return kernels::cuda::time_on_stream(reinterpret_cast<cudaStream_t>(backend::cuda_backend_stream(be_)),
                                           [&](int) { fn(); }, reps);
#endif
    for (int i = 0; i < 2; ++i) fn();
    be_.synchronize();
    std::vector<double> v;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) fn();
      be_.synchronize();
      v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    std::sort(v.begin(), v.end());
    return v[1];
  }

 private:
  backend::Backend& be_;
};

void fill_random(backend::Backend& be, Tensor& t, uint64_t stream, float stddev) {
  kernels::SyntheticFill p;
  p.stream = stream;
  p.stddev = stddev;
  p.cols = t.dim(-1);
  p.rows = t.numel() / p.cols;
  p.src_cols = p.cols;
  be.fill_synthetic(p, t, nullptr);
}

// An FP8 cache gets real codes and scales: random bf16 K/V rows quantized by the backend's kv_write.
// glm_moe_dsa's packed FP8 rows (kernels/mla_fp8.h): random latent / rope / indexer-key rows written through
// the backend's own cache_write (codes + scales at column 0, the bf16 rope tail after them).
void fill_packed_fp8_cache(backend::Backend& be, model::CausalLM& lm, kvcache::KvCache& kv) {
  const model::GlmMoeDsaConfig& d = model::glm_moe_dsa_config(lm.config());
  backend::MlaDsaOps* ops = backend::mla_dsa_ops(be);
  MX_CHECK_MSG(ops != nullptr, "bench-model: packed FP8 cache rows need the MLA ops of backend " << be.name());
  constexpr int64_t kRows = 4096;
  const int64_t n_slots = kv.spec().n_slots();
  Tensor slots_host = Tensor::empty(DType::kI32, {kRows});
  backend::AttentionMeta meta;
  uint64_t stream = 1000;
  for (int64_t l = 0; l < kv.spec().n_layers(); ++l)
    for (const kvcache::CacheTensorSpec& ts : kv.spec().layers[l].tensors) {
      const bool latent = ts.role == kvcache::CacheRole::kLatent;
      const int64_t quant = latent ? d.kv_lora_rank : d.index_head_dim, tail = latent ? d.qk_rope_dim : 0;
      for (int64_t begin = 0; begin < n_slots; begin += kRows) {
        const int64_t n = std::min(kRows, n_slots - begin);
        for (int64_t i = 0; i < n; ++i) slots_host.data<int32_t>()[i] = static_cast<int32_t>(begin + i);
        meta.slot_mapping = be.upload(slots_host.slice_rows(0, n));
        Tensor q_rows = be.alloc(be.activation_dtype(), {n, quant});
        fill_random(be, q_rows, stream++, 1.f);
        ops->cache_write(q_rows, meta, kv.tensor(l, ts.role), 0);
        if (tail > 0) {
          Tensor t_rows = be.alloc(be.activation_dtype(), {n, tail});
          fill_random(be, t_rows, stream++, 1.f);
          ops->cache_write(t_rows, meta, kv.tensor(l, ts.role), quant);
        }
      }
    }
  be.synchronize();
}

void fill_fp8_cache(backend::Backend& be, model::CausalLM& lm, kvcache::KvCache& kv) {
  if (kv.spec().layers.empty() || kv.spec().layers[0].find(kvcache::CacheRole::kKey) == nullptr)
    return fill_packed_fp8_cache(be, lm, kv);  // glm_moe_dsa: no K / V, packed FP8 rows
  const model::ModelConfig& c = lm.config();
  const int64_t width = c.n_kv_heads * c.head_dim, n_slots = kv.spec().n_slots();
  constexpr int64_t kRows = 4096;
  backend::AttentionMeta meta;
  meta.params.n_kv_heads = static_cast<int32_t>(c.n_kv_heads);
  meta.params.head_dim = static_cast<int32_t>(c.head_dim);
  Tensor x = be.alloc(be.activation_dtype(), {kRows, width});
  Tensor slots_host = Tensor::empty(DType::kI32, {kRows});
  uint64_t stream = 1000;
  for (int64_t l = 0; l < kv.spec().n_layers(); ++l) {
    meta.params.k_scales = kv.scales(l, kvcache::CacheRole::kKey).data<float>();
    meta.params.v_scales = kv.scales(l, kvcache::CacheRole::kValue).data<float>();
    for (int64_t begin = 0; begin < n_slots; begin += kRows) {
      const int64_t n = std::min(kRows, n_slots - begin);
      for (int64_t i = 0; i < n; ++i) slots_host.data<int32_t>()[i] = static_cast<int32_t>(begin + i);
      meta.slot_mapping = be.upload(slots_host.slice_rows(0, n));
      Tensor rows = x.slice_rows(0, n);
      fill_random(be, rows, stream++, 1.f);
      be.kv_write(rows, rows, meta, kv.k(l), kv.v(l));  // K and V get the same values: timing only
    }
  }
  be.synchronize();
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

}  // namespace

int cmd_bench_model(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {"--config", "--backend", "--num-layers", "--quantization", "--seed", "--batches", "--contexts",
                           "--prefill", "--model-batches", "--block-size", "--md", "--json", "--kv-cache-dtype",
                           "--moe-activation-dtype", "--shared-prefix", "--prefix-group"},
                          {"--synthetic-weights", "--disable-cascade-attention", "--cuda-graph", "--disable-cuda-graph",
                           "--enforce-eager"});
  if (!args.is_ok()) return fail(args.status());
  if (!args->has("--config") || !args->has("--synthetic-weights"))
    return fail(invalid_argument("bench-model needs --config FILE --synthetic-weights (`mxserve bench-model --help` "
                                 "lists the flags)"));
  auto batches = parse_sizes(*args, "--batches", "1,8,32,64");
  auto contexts = parse_sizes(*args, "--contexts", "2048,8192");
  auto prefill = parse_sizes(*args, "--prefill", "1024,8192,20480");
  auto model_batches = parse_sizes(*args, "--model-batches", "1,8");
  auto block_size = args->get_int("--block-size", 16);
  auto seed = args->get_int("--seed", 0);
  auto num_layers = args->get_int("--num-layers", 0);
  // The model decode step with prefix sharing (the seed workload: 12k of 20k shared in groups of 4):
  // --shared-prefix TOKENS (whole blocks of it are shared) --prefix-group N (sequences per shared prefix).
  auto shared_prefix = args->get_int("--shared-prefix", 0);
  auto prefix_group = args->get_int("--prefix-group", 4);
  if (!shared_prefix.is_ok()) return fail(shared_prefix.status());
  if (!prefix_group.is_ok()) return fail(prefix_group.status());
  if (*shared_prefix < 0 || *prefix_group < 1)
    return fail(invalid_argument("--shared-prefix must be >= 0 and --prefix-group >= 1"));
  for (const Status& s : {batches.status(), contexts.status(), prefill.status(), model_batches.status(),
                          block_size.status(), seed.status(), num_layers.status()})
    if (!s.is_ok()) return fail(s);
  if (*block_size <= 0 || *num_layers < 0) return fail(invalid_argument("--block-size and --num-layers must be positive"));
  if (*shared_prefix > 0 && !contexts->empty() && *shared_prefix >= contexts->front())
    return fail(invalid_argument("--shared-prefix " + std::to_string(*shared_prefix) + " must be below the context " +
                                 std::to_string(contexts->front()) + " (the first of --contexts)"));
  auto plan = model::parse_synthetic_plan(args->get_or("--quantization", ""));
  if (!plan.is_ok()) return fail(plan.status());
  auto kv_dtype = kvcache::parse_kv_cache_dtype(args->get_or("--kv-cache-dtype", "auto"));
  if (!kv_dtype.is_ok()) return fail(kv_dtype.status());
  const bool fp8_kv = *kv_dtype == kvcache::KvCacheDtype::kFp8E4M3;

  // The decode step through the engine's CUDA graphs (on by default on CUDA, as `serve`); the eager row always.
  const std::string backend_name = args->get_or("--backend", "cpu");
  auto cuda_graph = parse_cuda_graph_flags(*args, backend_name);
  if (!cuda_graph.is_ok()) return fail(cuda_graph.status());
  if (args->has("--cuda-graph") && backend_name != "cuda")
    return fail(invalid_argument("--cuda-graph: backend " + backend_name + " cannot capture graphs (decode graphs are "
                                 "CUDA-only); use --backend cuda or drop the flag"));

  launch::LaunchConfig lc;
  lc.backend = backend_name;
  lc.model.path = *args->get("--config");
  lc.model.load_mtp = false;
  lc.model.synthetic = true;
  lc.model.seed = static_cast<uint64_t>(*seed);
  lc.model.num_layers = *num_layers;
  lc.model.synthetic_quantization = args->get_or("--quantization", "");
  lc.model.kv_cache_dtype = *kv_dtype;
  lc.backend_options.kernels.moe_activation_dtype = args->get_or("--moe-activation-dtype", "");
  lc.backend_options.kernels.cascade_attention = !args->has("--disable-cascade-attention");
  auto launched = launch::launch_model(lc);
  if (!launched.is_ok()) return fail(launched.status());
  backend::Backend& be = (*launched)->backend();
  const double load_s = (*launched)->load_seconds();
  model::CausalLM& lm = (*launched)->model();
  const model::ModelConfig& c = lm.config();
  std::fprintf(stderr, "bench-model: %s on %s, %lld layers, plan %s:%s, loaded in %.2f s\n", c.source.c_str(),
               be.name().c_str(), static_cast<long long>(c.n_layers), plan->experts.c_str(), plan->rest.c_str(), load_s);

  int64_t moe_layer = -1;
  for (int64_t l = 0; l < c.n_layers && moe_layer < 0; ++l)
    if (c.is_moe_layer(l)) moe_layer = l;

  // ---- ceilings ----
  double copy_gbs = 0, gemm_tflops = 0;
#ifdef MXSERVE_HAVE_CUDA
  if (be.name() == "cuda") {
    const auto ceil = kernels::cuda::measure_ceilings(reinterpret_cast<cudaStream_t>(backend::cuda_backend_stream(be)));
    copy_gbs = ceil.copy_gbs;
    gemm_tflops = ceil.gemm_tflops;
    std::fprintf(stderr, "ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", copy_gbs, gemm_tflops);
  }
#endif

  // ---- sizes and byte / FLOP formulas ----
  const double w = dtype_bits(be.weight_dtype()) / 8.0, a = dtype_bits(be.activation_dtype()) / 8.0;
  const bool packed = plan->experts == "mxfp4" && be.supports_expert_format(backend::ExpertFormat::kMxfp4);
  const double we = packed ? 0.5 + 1.0 / 32 : w;
  const double H = static_cast<double>(c.d_model), K = static_cast<double>(c.top_k),
               I = static_cast<double>(c.moe_inter), Id = static_cast<double>(c.dense_inter);
  // Weight bytes and matmul FLOPs come from the declared weights (model/weight_stats.h).
  const auto& table = (*launched)->weight_table();
  auto layer_prefix = [](int64_t l) { return "model.layers." + std::to_string(l) + "."; };
  const model::BlockWeights attn = model::block_weights(table, layer_prefix(0) + "self_attn.");
  const model::BlockWeights moe =
      model::block_weights(table, layer_prefix(moe_layer >= 0 ? moe_layer : 0) + "mlp.");
  const double E = static_cast<double>(moe.n_experts);
  auto n_hit = [&](double T) { return E > 0 ? E * (1.0 - std::pow(1.0 - K / E, T)) : 0.0; };
  // The attention part: the architecture's cost model. Decode: b rows at context ctx. Prefill: one causal
  // chunk of p tokens from position 0.
  if (c.arch == nullptr || c.arch->attention_cost == nullptr)
    return fail(unsupported(std::string("bench-model: the architecture ") +
                            (c.arch != nullptr ? c.arch->hf_name : "of " + c.source) +
                            " declares no attention cost model (ArchitectureDef::attention_cost)"));
  model::CostUnits units;
  units.weight_bytes = w;
  units.act_bytes = a;
  units.fp8_kv = fp8_kv;
  units.attn_dense_params = attn.dense_params;
  units.attn_matmul_params = attn.matmul_params;
  const model::AttentionCost attn_cost = c.arch->attention_cost(c, units);
  auto decode_bytes = [&](double b, double ctx) { return attn_cost.decode(b, ctx).bytes; };
  auto decode_flops = [&](double b, double ctx) { return attn_cost.decode(b, ctx).flops; };
  auto prefill_bytes = [&](double p) { return attn_cost.prefill(p).bytes; };
  auto prefill_flops = [&](double p) { return attn_cost.prefill(p).flops; };
  auto moe_weight_bytes = [&](double T) {
    return static_cast<double>(moe.dense_params) * w + n_hit(T) * static_cast<double>(moe.per_expert_params) * we;
  };
  auto moe_bytes = [&](double T) { return moe_weight_bytes(T) + a * T * (4 * H + K * (2 * I + H)); };
  auto moe_flops = [&](double T) {
    return 2 * T * (static_cast<double>(moe.matmul_params) + K * static_cast<double>(moe.per_expert_params));
  };

  // ---- KV cache: room for the largest case, random K/V ----
  int64_t max_tokens = 0;
  for (int64_t b : *batches)
    for (int64_t ctx : *contexts) max_tokens = std::max(max_tokens, b * ((ctx + *block_size - 1) / *block_size) * *block_size);
  for (int64_t p : *prefill) max_tokens = std::max(max_tokens, ((p + *block_size - 1) / *block_size) * *block_size);
  for (int64_t b : *model_batches)
    max_tokens = std::max(max_tokens, b * ((contexts->front() + *block_size - 1) / *block_size) * *block_size);
  // Blocks [0, pool_blocks) for every case's sequences; one more: the decode graphs' scratch block.
  const int64_t pool_blocks = max_tokens / *block_size;
  kvcache::KvCache kv(lm.kv_spec(pool_blocks + 1, *block_size),
                      [&](DType dt, Shape s) { return be.alloc(dt, std::move(s)); });
  if (fp8_kv) {
    fill_fp8_cache(be, lm, kv);
  } else {
    uint64_t stream = 1000;  // K, V of layer 0, then layer 1, ...: the same streams as before layouts
    for (Tensor* t : kv.all_tensors()) fill_random(be, *t, stream++, 1.f);
  }
  std::fprintf(stderr, "KV cache: %lld blocks of %lld (%.1f MiB, %s)\n", static_cast<long long>(kv.spec().n_blocks),
               static_cast<long long>(*block_size), kv.spec().bytes() / 1048576.0,
               kvcache::kv_cache_dtype_name(*kv_dtype));

  Timer timer(be);
  std::vector<Row> rows;
  auto run_part = [&](int64_t layer, model::LayerPart part, const model::ForwardBatch& fb, int reps) -> Result<double> {
    MX_ASSIGN_OR_RETURN(auto fn, lm.bind_layer_part(layer, part, fb, kv));
    Tensor x = be.alloc(be.activation_dtype(), {fb.n_tokens(), c.d_model});
    fill_random(be, x, 77, 1.f);
    return timer.time([&] { fn(x); }, reps);
  };

  // ---- decode ----
  for (int64_t ctx : *contexts) {
    for (int64_t b : *batches) {
      const auto fb = make_bench_batch(b, ctx, 1, *block_size, false, c.vocab_size);
      auto ms = run_part(0, model::LayerPart::kAttention, fb, 20);
      if (!ms.is_ok()) return fail(ms.status(), 1);
      rows.push_back({"attention", "decode", b, ctx, b, *ms, decode_bytes(b, ctx), decode_flops(b, ctx)});
      std::fprintf(stderr, "attention decode b=%lld ctx=%lld: %.1f us\n", (long long)b, (long long)ctx, *ms * 1e3);
    }
  }
  if (moe_layer >= 0) {
    for (int64_t b : *batches) {
      const auto fb = make_bench_batch(b, contexts->front(), 1, *block_size, false, c.vocab_size);
      auto ms = run_part(moe_layer, model::LayerPart::kMlp, fb, 20);
      if (!ms.is_ok()) return fail(ms.status(), 1);
      rows.push_back({"moe", "decode", b, 0, b, *ms, moe_bytes(b), moe_flops(b)});
      std::fprintf(stderr, "moe decode b=%lld: %.1f us\n", (long long)b, *ms * 1e3);
    }
  } else {
    std::fprintf(stderr, "note: no MoE layer in the first %lld layers: MoE rows skipped\n", (long long)c.n_layers);
  }

  // ---- prefill: one sequence, a causal chunk from position 0 ----
  for (int64_t p : *prefill) {
    const auto fb = make_bench_batch(1, p, p, *block_size, false, c.vocab_size);
    const int reps = p >= 4096 ? 1 : 3;
    auto ms = run_part(0, model::LayerPart::kAttention, fb, reps);
    if (!ms.is_ok()) return fail(ms.status(), 1);
    rows.push_back({"attention", "prefill", 1, p, p, *ms, prefill_bytes(p), prefill_flops(p)});
    std::fprintf(stderr, "attention prefill %lld: %.1f us\n", (long long)p, *ms * 1e3);
    if (moe_layer >= 0) {
      auto mms = run_part(moe_layer, model::LayerPart::kMlp, fb, reps);
      if (!mms.is_ok()) return fail(mms.status(), 1);
      rows.push_back({"moe", "prefill", 1, p, p, *mms, moe_bytes(p), moe_flops(p)});
      std::fprintf(stderr, "moe prefill %lld: %.1f us\n", (long long)p, *mms * 1e3);
    }
  }

  // ---- the truncated model's decode step (cli/bench_model_step.h): eager, and through the engine's CUDA graphs ----
  // Both end with the greedy ids on the host as the engine's device sampler takes them (no f32 logits download).
  const int64_t step_ctx = contexts->front();
  int64_t max_model_batch = 1;
  for (int64_t b : *model_batches) max_model_batch = std::max(max_model_batch, b);
  // As the engine runs it: the block tables live in the cache's persistent store (one row per sequence, synced
  // once; a decode step then uploads no table), plus the graphs' scratch row.
  DecodeStepBench step(lm, be, kv, max_model_batch, step_ctx, *block_size, pool_blocks);
  if (Status st = step.enable_block_tables(); !st.is_ok()) return fail(st, 1);
  if (*cuda_graph) {
    if (Status st = step.capture_graphs(); !st.is_ok()) {
      std::fprintf(stderr, "error: decode graphs for the decode step (graph) row (--cuda-graph, on by default with "
                   "--backend cuda; --disable-cuda-graph skips the row): %s\n", st.to_string().c_str());
      return 1;
    }
    if (step.capture_cascade_launches() >= 0)
      std::fprintf(stderr, "decode graphs: the capture called the cascade attention kernel %lld times (graphs of >= 2 "
                   "rows hold it when cascade attention is on; 0: every replay attends per sequence)\n",
                   static_cast<long long>(step.capture_cascade_launches()));
  } else {
    std::fprintf(stderr, "note: decode step (graph) row skipped: %s\n",
                 be.name() == "cuda" ? "--disable-cuda-graph / --enforce-eager"
                                     : ("CUDA graphs are CUDA-only (backend " + be.name() + ")").c_str());
  }
  const model::BlockWeights head = model::block_weights(table, "lm_head.");
  const double head_params = head.dense_params > 0 ? static_cast<double>(head.dense_params)
                                                   : static_cast<double>(c.vocab_size) * H;  // tied: the embedding
  std::vector<std::string> step_notes;  // one line per batch: prefix groups, graph details
  for (int64_t b : *model_batches) {
    const int64_t shared_blocks = std::min(*shared_prefix, step_ctx - 1) / *block_size;
    auto fb = make_bench_batch(b, step_ctx, 1, *block_size, true, c.vocab_size, shared_blocks, *prefix_group);
    if (Status st = step.assign_rows(fb); !st.is_ok()) return fail(st, 1);
    double bytes = H * w + head_params * w;  // final norm + lm_head
    double flops = 2.0 * b * head_params;
    // K/V bytes that must be read: each shared prefix once per group (cascade attention), every suffix.
    const double shared_keys = static_cast<double>(shared_blocks * *block_size);
    const double n_groups = static_cast<double>((b + *prefix_group - 1) / *prefix_group);
    const double shared_saving =
        shared_blocks > 0 ? (b - n_groups) * (decode_bytes(1, shared_keys) - decode_bytes(1, 0)) : 0.0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      bytes += decode_bytes(b, step_ctx) - shared_saving;
      flops += decode_flops(b, step_ctx);
      if (c.is_moe_layer(l)) {
        bytes += moe_bytes(b);
        flops += moe_flops(b);
      } else {
        const model::BlockWeights mlp = model::block_weights(table, layer_prefix(l) + "mlp.");
        bytes += static_cast<double>(mlp.dense_params) * w + a * b * (4 * H + 3 * Id);
        flops += 2.0 * b * static_cast<double>(mlp.matmul_params);
      }
    }
    auto add_row = [&](const std::string& path, double ms) {
      Row r{"model", "step", b, step_ctx, b, ms, bytes, flops};
      r.path = path;
      r.tok_s = b / (r.ms * 1e-3);
      r.roofline_tok_s = copy_gbs > 0 ? b / (bytes / (copy_gbs * 1e9)) : 0;
      rows.push_back(r);
      std::fprintf(stderr, "model decode step (%s) b=%lld ctx=%lld: %.3f ms, %.1f tok/s\n", path.c_str(), (long long)b,
                   (long long)step_ctx, r.ms, r.tok_s);
    };
    const CascadeDecision casc = cascade_decision(fb, be, c, *block_size);
    std::string note = "b=" + std::to_string(b) + ": " + casc.describe();
    std::vector<int32_t> eager_ids;
    auto eager = step.time_eager(fb, &eager_ids);
    if (!eager.is_ok()) return fail(eager.status(), 1);
    add_row("eager", eager->ms);
    if (be.name() == "cuda" && eager->cascade_launches >= 0)  // observed: the kernel's host-call counter
      note += "; eager: " + std::to_string(eager->cascade_launches) + " cascade kernel calls over " +
              std::to_string(kStepWarmup + kStepTimed) + " steps of " + std::to_string(c.n_layers) + " layers";
    if (*cuda_graph) {
      auto g = step.time_graph(fb, &eager_ids);
      if (!g.is_ok()) return fail(g.status(), 1);
      add_row("graph", g->ms);
      note += "; graph: " + std::to_string(g->replays) + " replays, ids " +
              (g->tail ? "from the graph's sampling tail" : "by argmax after the replay (no sampling tail)") + ", " +
              std::to_string(g->ids_equal_eager) + "/" + std::to_string(b) + " greedy ids equal to the eager step's" +
              "; whether a replay's prefix-group buffer held groups is not reported by DecodeGraphs (it applies the "
              "rule above before each replay)";
    }
    std::fprintf(stderr, "decode step %s\n", note.c_str());
    step_notes.push_back(note);
  }

  // ---- report ----
  auto pct = [](double x, double ceil) { return ceil > 0 ? fmt("%.1f%%", 100 * x / ceil) : std::string("n/a"); };
  std::ostringstream md;
  md << "model: " << c.source << ", " << c.n_layers << " layers (attention: layer 0; MoE: layer " << moe_layer
     << "), experts " << plan->experts << (packed ? " (packed)" : "") << ", rest " << plan->rest << ", backend "
     << be.name() << ", load " << fmt("%.2f", load_s) << " s\n";
  md << "ceilings: copy " << (copy_gbs > 0 ? fmt("%.0f GB/s", copy_gbs) : "n/a") << ", bf16 GEMM "
     << (gemm_tflops > 0 ? fmt("%.0f TFLOP/s", gemm_tflops) : "n/a") << "\n\n";
  md << "| layer | mode | batch | context | tokens | time (us) | MB | GB/s | % copy BW | TFLOP/s | % GEMM |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    if (r.part == "model") continue;
    const double s = r.ms * 1e-3, gbs = r.bytes / s / 1e9, tf = r.flops / s / 1e12;
    md << "| " << r.part << " | " << r.mode << " | " << r.batch << " | " << r.context << " | " << r.tokens << " | "
       << fmt("%.1f", r.ms * 1e3) << " | " << fmt("%.1f", r.bytes / 1e6) << " | " << fmt("%.0f", gbs) << " | "
       << pct(gbs, copy_gbs) << " | " << fmt("%.1f", tf) << " | " << pct(tf, gemm_tflops) << " |\n";
  }
  md << "\n| truncated model decode step | batch | context | step (ms) | tok/s | weights+KV MB per step | roofline tok/s | % roofline | path |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& r : rows) {
    if (r.part != "model") continue;
    md << "| " << c.n_layers << " layers + lm_head | " << r.batch << " | " << r.context << " | " << fmt("%.3f", r.ms)
       << " | " << fmt("%.1f", r.tok_s) << " | " << fmt("%.1f", r.bytes / 1e6) << " | "
       << (r.roofline_tok_s > 0 ? fmt("%.1f", r.roofline_tok_s) : "n/a") << " | " << pct(r.tok_s, r.roofline_tok_s)
       << " | decode step (" << r.path << ") |\n";
  }
  md << "\ndecode step paths: eager" << (*cuda_graph ? " and graph (the engine's CUDA-graph replay)" : "")
     << "; prefix groups are the cascade rule's decision predicted on the host (neither path reports it):\n";
  for (const std::string& n : step_notes) md << "- " << n << "\n";
  std::printf("%s", md.str().c_str());

  std::ostringstream js;
  js << "{\n  \"config\": \"" << c.source << "\",\n  \"backend\": \"" << be.name() << "\",\n  \"n_layers\": "
     << c.n_layers << ",\n  \"moe_layer\": " << moe_layer << ",\n  \"experts\": \"" << plan->experts
     << "\",\n  \"experts_packed\": " << (packed ? "true" : "false") << ",\n  \"rest\": \"" << plan->rest
     << "\",\n  \"load_s\": " << load_s << ",\n  \"copy_gbs\": " << copy_gbs << ",\n  \"gemm_tflops\": " << gemm_tflops
     << ",\n  \"cuda_graph\": " << (*cuda_graph ? "true" : "false") << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    js << "    {\"part\": \"" << r.part << "\", \"mode\": \"" << r.mode << "\", \"batch\": " << r.batch
       << ", \"context\": " << r.context << ", \"tokens\": " << r.tokens << ", \"ms\": " << r.ms
       << ", \"bytes\": " << r.bytes << ", \"flops\": " << r.flops;
    if (r.part == "model")
      js << ", \"path\": \"" << r.path << "\", \"tok_s\": " << r.tok_s << ", \"roofline_tok_s\": " << r.roofline_tok_s;
    js << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  js << "  ],\n  \"step_notes\": [";
  for (size_t i = 0; i < step_notes.size(); ++i) js << (i ? ", " : "") << "\"" << step_notes[i] << "\"";
  js << "]\n}\n";
  for (const auto& [flag, text] : {std::pair<std::string, std::string>{"--md", md.str()}, {"--json", js.str()}}) {
    if (!args->has(flag)) continue;
    const std::string path = *args->get(flag);
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return fail(invalid_argument(flag + " " + path + ": cannot open for writing"));
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace mxserve::cli
