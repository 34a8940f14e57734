// quantize (and, later, compare): the weight-quantization subcommands.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "quant/quantizer.h"

namespace mxserve::cli {
namespace {

int fail(const Status& s, int code = 2) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return code;
}

// --exclude may repeat: collect every value and hand the rest to Args (which keeps one value per flag).
std::vector<char*> take_repeated(int argc, char** argv, const std::string& flag, std::vector<std::string>& values,
                                 Status& status) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag) {
      if (i + 1 >= argc) status = invalid_argument("flag " + flag + " needs a value");
      else values.push_back(argv[++i]);
    } else if (a.rfind(flag + "=", 0) == 0) {
      values.push_back(a.substr(flag.size() + 1));
    } else {
      rest.push_back(argv[i]);
    }
  }
  return rest;
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  quant::QuantizeOptions o;
  Status st;
  std::vector<char*> rest = take_repeated(argc, argv, "--exclude", o.exclude_globs, st);
  if (!st.is_ok()) return fail(st);
  auto args = Args::parse(static_cast<int>(rest.size()), rest.data(),
                          {"--in", "--out", "--scheme", "--scale-rule", "--mtp-layer", "--shard-size-mb"},
                          {"--quantize-shared-experts"});
  if (!args.is_ok()) return fail(args.status());
  if (!args->positional().empty())
    return fail(invalid_argument("usage: mxserve quantize --in DIR --out DIR --scheme mxfp4|fp8-block "
                                 "[--scale-rule even|floor|ceil] [--exclude GLOB ...] [--quantize-shared-experts] "
                                 "[--mtp-layer same|bf16] [--shard-size-mb N]"));
  auto in = args->get("--in");
  auto out = args->get("--out");
  auto scheme = args->get("--scheme");
  if (!in.is_ok()) return fail(in.status());
  if (!out.is_ok()) return fail(out.status());
  if (!scheme.is_ok()) return fail(scheme.status());
  auto sc = quant::parse_scheme(*scheme);
  if (!sc.is_ok()) return fail(sc.status());
  auto rule = quant::parse_scale_rule(args->get_or("--scale-rule", "even"));
  if (!rule.is_ok()) return fail(rule.status().with_context("--scale-rule"));
  if (*sc != quant::Scheme::kMxfp4 && args->has("--scale-rule"))
    return fail(invalid_argument("--scale-rule applies to --scheme mxfp4 only"));
  const std::string mtp = args->get_or("--mtp-layer", "same");
  if (mtp != "same" && mtp != "bf16") return fail(invalid_argument("--mtp-layer '" + mtp + "': expected same or bf16"));
  auto shard_mb = args->get_int("--shard-size-mb", 4096);
  if (!shard_mb.is_ok()) return fail(shard_mb.status());
  if (*shard_mb <= 0) return fail(invalid_argument("--shard-size-mb must be positive"));
  o.in_dir = *in;
  o.out_dir = *out;
  o.scheme = *sc;
  o.scale_rule = *rule;
  o.quantize_shared_experts = args->has("--quantize-shared-experts");
  o.mtp_bf16 = mtp == "bf16";
  o.shard_bytes = static_cast<uint64_t>(*shard_mb) << 20;
  auto report = quant::quantize_checkpoint(o, stderr);
  if (!report.is_ok()) return fail(report.status());
  std::printf("%s -> %s: %lld of %lld tensors quantized to %s%s%s, %lld shard(s), %.2f MB -> %.2f MB, %zu Linear modules "
              "kept unquantized (listed in quantization_config)\n",
              o.in_dir.c_str(), o.out_dir.c_str(), static_cast<long long>(report->n_quantized),
              static_cast<long long>(report->n_tensors), quant::scheme_name(o.scheme),
              o.scheme == quant::Scheme::kMxfp4 ? " scale rule " : "",
              o.scheme == quant::Scheme::kMxfp4 ? quant::scale_rule_name(o.scale_rule) : "",
              static_cast<long long>(report->n_shards), report->bytes_in / 1e6, report->bytes_out / 1e6,
              report->kept_modules.size());
  return 0;
}

}  // namespace mxserve::cli
