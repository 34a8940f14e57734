#include "quant/quantizer.h"

#include <fnmatch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "quant/fp8.h"
#include "quant/host_float.h"
#include "quant/stream_writer.h"

namespace mxserve::quant {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One input tensor and what it becomes.
struct Item {
  std::string name;
  bool quantize = false;
  std::vector<PlannedTensor> outputs;  // 1 (copy) or 2 (weight + scale)
  uint64_t bytes() const {
    uint64_t b = 0;
    for (const auto& o : outputs) b += o.bytes();
    return b;
  }
};

int64_t layer_index(const std::string& name) {
  static const std::regex kLayer(R"(^model\.layers\.([0-9]+)\..*)");
  std::smatch m;
  return std::regex_match(name, m, kLayer) ? std::stoll(m[1].str()) : -1;
}

Status check_finite(const Tensor& w, const std::string& name, const std::string& file) {
  std::vector<float> row(static_cast<size_t>(w.dim(1)));
  for (int64_t r = 0; r < w.dim(0); ++r) {
    read_f32(w, r * w.dim(1), w.dim(1), row.data());
    for (int64_t c = 0; c < w.dim(1); ++c)
      if (!std::isfinite(row[c]))
        return invalid_argument(file + ": tensor '" + name + "' holds a non-finite value (" + std::to_string(row[c]) +
                                ") at [" + std::to_string(r) + ", " + std::to_string(c) + "]: refusing to quantize");
  }
  return Status::ok();
}

nlohmann::ordered_json quark_config(ScaleRule rule, const std::vector<std::string>& exclude) {
  nlohmann::ordered_json w = {{"dtype", "fp4"},           {"qscheme", "per_group"},
                              {"group_size", 32},         {"ch_axis", -1},
                              {"is_dynamic", false},      {"scale_format", "e8m0"},
                              {"scale_type", "float"},    {"scale_calculation_mode", scale_rule_name(rule)},
                              {"round_method", "half_even"}, {"observer_cls", "PerBlockMXObserver"},
                              {"symmetric", nullptr},     {"mx_element_dtype", nullptr},
                              {"is_scale_quant", false}};
  nlohmann::ordered_json q;
  q["quant_method"] = "quark";
  q["quant_mode"] = "eager_mode";
  q["version"] = "mxserve";
  q["global_quant_config"] = {{"weight", w},          {"input_tensors", nullptr}, {"output_tensors", nullptr},
                              {"bias", nullptr},      {"target_device", nullptr}};
  q["exclude"] = exclude;
  q["layer_quant_config"] = nlohmann::ordered_json::object();
  q["layer_type_quant_config"] = nlohmann::ordered_json::object();
  q["kv_cache_quant_config"] = nlohmann::ordered_json::object();
  q["export"] = {{"kv_cache_group", nlohmann::ordered_json::array()}, {"min_kv_scale", 0.0},
                 {"pack_method", "reorder"}, {"weight_format", "real_quantized"}, {"weight_merge_groups", nullptr}};
  return q;
}

nlohmann::ordered_json compressed_tensors_config(const std::vector<std::string>& keep, const char* strategy) {
  nlohmann::ordered_json w = {{"num_bits", 8},       {"type", "float"},          {"symmetric", true},
                              {"strategy", strategy}, {"dynamic", false},        {"group_size", nullptr},
                              {"block_structure", nullptr}, {"actorder", nullptr}, {"observer", "minmax"}};
  nlohmann::ordered_json q;
  q["quant_method"] = "compressed-tensors";
  q["format"] = "float-quantized";
  q["quantization_status"] = "compressed";
  q["config_groups"] = {{"group_0", {{"targets", {"Linear"}}, {"weights", w}, {"input_activations", nullptr},
                                     {"output_activations", nullptr}}}};
  q["ignore"] = keep;
  q["kv_cache_scheme"] = nullptr;
  q["global_compression_ratio"] = nullptr;
  return q;
}

nlohmann::ordered_json fp8_config(const std::vector<std::string>& keep) {
  nlohmann::ordered_json q;
  q["quant_method"] = "fp8";
  q["fmt"] = "e4m3";
  q["activation_scheme"] = "dynamic";
  q["weight_block_size"] = {kFp8Block, kFp8Block};
  q["modules_to_not_convert"] = keep;
  return q;
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return out ? Status::ok() : internal_error(path + ": write failed");
}

}  // namespace

const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::kMxfp4: return "mxfp4";
    case Scheme::kFp8Block: return "fp8-block";
    case Scheme::kFp8Channel: return "fp8-channel";
    case Scheme::kFp8Tensor: return "fp8-tensor";
  }
  return "?";
}

Result<Scheme> parse_scheme(const std::string& name) {
  if (name == "mxfp4") return Scheme::kMxfp4;
  if (name == "fp8-block") return Scheme::kFp8Block;
  if (name == "fp8-channel") return Scheme::kFp8Channel;
  if (name == "fp8-tensor") return Scheme::kFp8Tensor;
  return invalid_argument("--scheme '" + name + "': expected mxfp4, fp8-block, fp8-channel or fp8-tensor");
}

Result<QuantizeReport> quantize_checkpoint(const QuantizeOptions& o, std::FILE* progress) {
  // ---- input: config and checkpoint ----
  const std::string cfg_path = o.in_dir + "/config.json";
  MX_ASSIGN_OR_RETURN(std::string cfg_text, io::read_text_file(cfg_path));
  auto cfg = nlohmann::ordered_json::parse(cfg_text, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return invalid_argument(cfg_path + ": not a JSON object");
  if (cfg.contains("quantization_config") && !cfg["quantization_config"].is_null())
    return invalid_argument(cfg_path + ": the input already has a quantization_config: quantize a bf16/f32 checkpoint");
  if (!cfg.contains("num_hidden_layers") || !cfg["num_hidden_layers"].is_number_integer())
    return invalid_argument(cfg_path + ": field 'num_hidden_layers': expected an integer");
  const int64_t n_layers = cfg["num_hidden_layers"].get<int64_t>();
  MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(o.in_dir));
  if (fs::exists(o.out_dir) && !fs::is_empty(o.out_dir))
    return invalid_argument("--out " + o.out_dir + ": the output directory exists and is not empty");
  std::error_code ec;
  if (fs::exists(o.out_dir) && fs::equivalent(o.in_dir, o.out_dir, ec))
    return invalid_argument("--out must differ from --in");

  static const std::regex kRouted(R"(^model\.layers\.[0-9]+\.mlp\.experts\.[0-9]+\.(gate|up|down)_proj\.weight$)");
  static const std::regex kShared(R"(^model\.layers\.[0-9]+\.mlp\.shared_experts\.(gate|up|down)_proj\.weight$)");

  // ---- plan: what each tensor becomes ----
  QuantizeReport report;
  std::vector<Item> items;
  for (const auto& name : ckpt->names()) {
    const io::TensorInfo& info = *ckpt->find(name)->info;
    if (!is_plain_float(info.dtype))
      return invalid_argument(ckpt->path() + ": tensor '" + name + "' is " + dtype_name(info.dtype) +
                              ": the input must be an unquantized (f32/bf16/f16) checkpoint");
    ++report.n_tensors;
    report.bytes_in += dtype_bytes(info.dtype, shape_numel(info.shape)).value_or(0);
    Item it;
    it.name = name;
    const bool linear = ends_with(name, ".weight") && info.shape.size() == 2 && name.find("embed_tokens") == std::string::npos;
    const std::string module = linear ? name.substr(0, name.size() - 7) : name;
    bool q = linear && (std::regex_match(name, kRouted) || (o.quantize_shared_experts && std::regex_match(name, kShared)));
    for (const auto& g : o.exclude_globs)
      if (::fnmatch(g.c_str(), module.c_str(), 0) == 0 || ::fnmatch(g.c_str(), name.c_str(), 0) == 0) q = false;
    if (o.mtp_bf16 && layer_index(name) >= n_layers) q = false;
    it.quantize = q;
    if (linear && !q) report.kept_modules.push_back(module);
    if (!q) {
      it.outputs.push_back({name, info.dtype, info.shape});
    } else {
      const int64_t out = info.shape[0], in = info.shape[1];
      if (o.scheme == Scheme::kMxfp4) {
        if (in % 2 != 0)
          return invalid_argument(ckpt->path() + ": tensor '" + name + "' " + shape_to_string(info.shape) +
                                  " has an odd input width: MXFP4 cannot pack it (leave it out with --exclude)");
        it.outputs.push_back({name, DType::kU8, {out, in / 2}});
        it.outputs.push_back({module + ".weight_scale", DType::kU8, {out, mx_scale_cols(in)}});
      } else if (o.scheme == Scheme::kFp8Block) {
        it.outputs.push_back({name, DType::kFP8E4M3, {out, in}});
        it.outputs.push_back({module + ".weight_scale_inv", DType::kF32,
                              {(out + kFp8Block - 1) / kFp8Block, (in + kFp8Block - 1) / kFp8Block}});
      } else {
        it.outputs.push_back({name, DType::kFP8E4M3, {out, in}});
        it.outputs.push_back({module + ".weight_scale", DType::kF32,
                              o.scheme == Scheme::kFp8Channel ? Shape{out, 1} : Shape{1}});
      }
      ++report.n_quantized;
    }
    items.push_back(std::move(it));
  }
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!shards.back().empty() && shard_bytes + items[i].bytes() > o.shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += items[i].bytes();
  }
  report.n_shards = static_cast<int64_t>(shards.size());

  // ---- write shards, one tensor in memory at a time ----
  fs::create_directories(o.out_dir, ec);
  if (ec) return internal_error(o.out_dir + ": cannot create: " + ec.message());
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"mxserve.scheme", scheme_name(o.scheme)},
      {"mxserve.scale_rule", o.scheme == Scheme::kMxfp4 ? scale_rule_name(o.scale_rule) : "amax/448"}};
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  const bool tty = progress != nullptr && ::isatty(::fileno(progress));
  int64_t done = 0, last_pct = -1;
  char shard_name[64];
  for (size_t s = 0; s < shards.size(); ++s) {
    std::snprintf(shard_name, sizeof(shard_name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<PlannedTensor> plan;
    for (size_t i : shards[s])
      for (const auto& p : items[i].outputs) {
        plan.push_back(p);
        weight_map[p.name] = shard_name;
        report.bytes_out += p.bytes();
      }
    MX_ASSIGN_OR_RETURN(auto writer, SafetensorsStreamWriter::create(o.out_dir + "/" + shard_name, plan, meta));
    for (size_t i : shards[s]) {
      const Item& it = items[i];
      const io::CheckpointTensor* ct = ckpt->find(it.name);
      const Tensor src = ckpt->view(*ct);
      if (!it.quantize) {
        MX_RETURN_IF_ERROR(writer->append(it.name, src));
      } else {
        MX_RETURN_IF_ERROR(check_finite(src, it.name, ct->file->path()));
        if (o.scheme == Scheme::kMxfp4) {
          MX_ASSIGN_OR_RETURN(MxTensors q, quantize_mxfp4(src, o.scale_rule, it.name));
          MX_RETURN_IF_ERROR(writer->append(it.outputs[0].name, q.packed));
          MX_RETURN_IF_ERROR(writer->append(it.outputs[1].name, q.scales));
        } else {
          MX_ASSIGN_OR_RETURN(Fp8Tensors q, o.scheme == Scheme::kFp8Block
                                                ? quantize_fp8_block(src, kFp8Block, kFp8Block, it.name)
                                            : o.scheme == Scheme::kFp8Channel ? quantize_fp8_channel(src, it.name)
                                                                              : quantize_fp8_tensor(src, it.name));
          MX_RETURN_IF_ERROR(writer->append(it.outputs[0].name, q.weight));
          MX_RETURN_IF_ERROR(writer->append(it.outputs[1].name, q.scale));
        }
      }
      ++done;
      const int64_t pct = 100 * done / static_cast<int64_t>(items.size());
      if (progress != nullptr && (tty || pct / 10 != last_pct / 10 || done == static_cast<int64_t>(items.size()))) {
        std::fprintf(progress, tty ? "\r[%3lld%%] %lld/%zu tensors, shard %zu/%zu\x1b[K" : "[%3lld%%] %lld/%zu tensors, shard %zu/%zu\n",
                     static_cast<long long>(pct), static_cast<long long>(done), items.size(), s + 1, shards.size());
        std::fflush(progress);
      }
      last_pct = pct;
    }
    MX_RETURN_IF_ERROR(writer->finish());
  }
  if (tty) std::fprintf(progress, "\n");

  // ---- index, config, other files ----
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", report.bytes_out}};
  index["weight_map"] = weight_map;
  MX_RETURN_IF_ERROR(write_text(o.out_dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  cfg["quantization_config"] = o.scheme == Scheme::kMxfp4      ? quark_config(o.scale_rule, report.kept_modules)
                               : o.scheme == Scheme::kFp8Block ? fp8_config(report.kept_modules)
                               : o.scheme == Scheme::kFp8Channel
                                   ? compressed_tensors_config(report.kept_modules, "channel")
                                   : compressed_tensors_config(report.kept_modules, "tensor");
  MX_RETURN_IF_ERROR(write_text(o.out_dir + "/config.json", cfg.dump(2) + "\n"));
  std::set<std::string> skip = {"config.json", "model.safetensors", "model.safetensors.index.json"};
  if (io::file_exists(o.in_dir + "/model.safetensors.index.json")) {
    MX_ASSIGN_OR_RETURN(std::string text, io::read_text_file(o.in_dir + "/model.safetensors.index.json"));
    auto idx = nlohmann::json::parse(text, nullptr, false);
    if (!idx.is_discarded() && idx.contains("weight_map") && idx["weight_map"].is_object())
      for (const auto& [_, shard] : idx["weight_map"].items())
        if (shard.is_string()) skip.insert(shard.get<std::string>());
  }
  for (const auto& e : fs::directory_iterator(o.in_dir)) {
    if (!e.is_regular_file() || skip.count(e.path().filename().string())) continue;
    fs::copy_file(e.path(), fs::path(o.out_dir) / e.path().filename(), ec);
    if (ec) return internal_error(e.path().string() + ": copy failed: " + ec.message());
  }
  return report;
}

}  // namespace mxserve::quant
