// The seed's layout as one command (issue 32 item 4): sglang's and vLLM's spellings of tp / dp / ep / DP
// attention / MTP / FP8 KV parse to the same ParallelConfig, SpecConfig and KV dtype; spellings that disagree
// are errors naming both flags.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cli/parallel_flags.h"
#include "cli/spec_flags.h"
#include "kvcache/kv_cache.h"

namespace mxserve::cli {
namespace {

struct Parsed {
  parallel::ParallelConfig p;
  runtime::SpecConfig spec;
  kvcache::KvCacheDtype kv;
};

Result<Parsed> parse(std::vector<std::string> a) {
  a.insert(a.begin(), "serve");
  std::vector<char*> ptrs;
  for (auto& s : a) ptrs.push_back(s.data());
  std::set<std::string> values = kParallelValueFlags, bools = kParallelBoolFlags;
  values.insert(kSpecValueFlags.begin(), kSpecValueFlags.end());
  bools.insert(kSpecBoolFlags.begin(), kSpecBoolFlags.end());
  values.insert("--kv-cache-dtype");
  MX_ASSIGN_OR_RETURN(Args args, Args::parse(static_cast<int>(ptrs.size()), ptrs.data(), values, bools));
  Parsed out;
  MX_ASSIGN_OR_RETURN(out.p, parse_parallel_flags(args));
  MX_ASSIGN_OR_RETURN(out.spec, parse_spec_flags(args));
  MX_ASSIGN_OR_RETURN(out.kv, kvcache::parse_kv_cache_dtype(args.get_or("--kv-cache-dtype", "auto")));
  return out;
}

void expect_same(const Parsed& a, const Parsed& b, const std::string& what) {
  EXPECT_EQ(a.p.tp, b.p.tp) << what;
  EXPECT_EQ(a.p.dp, b.p.dp) << what;
  EXPECT_EQ(a.p.ep, b.p.ep) << what;
  EXPECT_EQ(a.p.dp_attention, b.p.dp_attention) << what;
  EXPECT_EQ(a.spec.num_steps, b.spec.num_steps) << what;
  EXPECT_EQ(a.spec.topk, b.spec.topk) << what;
  EXPECT_EQ(a.kv, b.kv) << what;
}

TEST(LayoutAliases, TheSeedLayoutInEverySpelling) {
  auto sglang = parse({"--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--speculative-algorithm", "mtp",
                       "--kv-cache-dtype", "fp8_e4m3"});
  ASSERT_TRUE(sglang.is_ok()) << sglang.status().to_string();
  EXPECT_EQ(sglang->p.tp, 4);
  EXPECT_EQ(sglang->p.dp, 2);
  EXPECT_TRUE(sglang->p.dp_attention);
  EXPECT_EQ(sglang->spec.num_steps, 3);
  EXPECT_EQ(sglang->kv, kvcache::KvCacheDtype::kFp8E4M3);
  const std::vector<std::vector<std::string>> others = {
      {"--tensor-parallel-size", "4", "--data-parallel-size", "2", "--enable-dp-attention", "--speculative-config",
       R"({"method": "mtp", "num_speculative_tokens": 3})", "--kv-cache-dtype", "fp8"},
      {"--tensor-parallel-size", "4", "--dp-size", "2", "--enable-dp-attention", "--speculative-algorithm", "NEXTN",
       "--speculative-num-steps", "3", "--kv-cache-dtype", "fp8_e4m3"},
      {"--tp-size", "4", "--data-parallel-size", "2", "--enable-dp-attention", "--speculative-config",
       R"({"method": "deepseek_mtp"})", "--kv-cache-dtype", "fp8_e4m3"},
      {"-tp", "4", "-dp=2", "--enable-dp-attention", "--speculative-algorithm", "EAGLE", "--kv-cache-dtype",
       "fp8_e4m3"},  // vLLM's short spellings
  };
  for (const auto& o : others) {
    auto r = parse(o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    expect_same(*sglang, *r, o[0] + " " + o[6]);
  }
}

TEST(LayoutAliases, ExpertParallelSpellings) {
  auto a = parse({"--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "8"});
  auto b = parse({"--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--expert-parallel-size", "8"});
  auto c = parse({"--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--enable-expert-parallel"});
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(a->p.ep, 8);
  expect_same(*a, *b, "--expert-parallel-size");
  expect_same(*a, *c, "--enable-expert-parallel");
}

TEST(LayoutAliases, DisagreeingSpellingsAreErrors) {
  auto tp = parse({"--tp-size", "4", "--tensor-parallel-size", "2"});
  ASSERT_FALSE(tp.is_ok());
  EXPECT_NE(tp.status().message().find("disagree"), std::string::npos) << tp.status().to_string();
  auto ep = parse({"--tp-size", "2", "--ep-size", "2", "--expert-parallel-size", "1"});
  ASSERT_FALSE(ep.is_ok());
  EXPECT_NE(ep.status().message().find("--expert-parallel-size"), std::string::npos) << ep.status().to_string();
  auto steps = parse({"--speculative-config", R"({"method": "mtp", "num_speculative_tokens": 2})",
                      "--speculative-num-steps", "4"});
  ASSERT_FALSE(steps.is_ok());
  EXPECT_NE(steps.status().message().find("disagree"), std::string::npos) << steps.status().to_string();
  auto method = parse({"--speculative-config", R"({"method": "ngram"})"});
  ASSERT_FALSE(method.is_ok());
  EXPECT_NE(method.status().message().find("ngram"), std::string::npos) << method.status().to_string();
  auto json = parse({"--speculative-config", "mtp"});
  ASSERT_FALSE(json.is_ok());
  EXPECT_NE(json.status().message().find("JSON object"), std::string::npos) << json.status().to_string();
}

// --disable-custom-all-reduce (vLLM) reaches launch_model() as MXSERVE_FUSED_ALLREDUCE=0 (parallel/fused_path.h);
// with MXSERVE_FUSED_ALLREDUCE=1 already set it is an error naming both.
TEST(LayoutAliases, DisableCustomAllReduce) {
  unsetenv("MXSERVE_FUSED_ALLREDUCE");
  ASSERT_TRUE(parse({"--tp-size", "2"}).is_ok());
  EXPECT_EQ(std::getenv("MXSERVE_FUSED_ALLREDUCE"), nullptr);
  ASSERT_TRUE(parse({"--tp-size", "2", "--disable-custom-all-reduce"}).is_ok());
  ASSERT_NE(std::getenv("MXSERVE_FUSED_ALLREDUCE"), nullptr);
  EXPECT_EQ(std::string(std::getenv("MXSERVE_FUSED_ALLREDUCE")), "0");
  setenv("MXSERVE_FUSED_ALLREDUCE", "1", 1);
  auto both = parse({"--tp-size", "2", "--disable-custom-all-reduce"});
  ASSERT_FALSE(both.is_ok());
  EXPECT_NE(both.status().message().find("MXSERVE_FUSED_ALLREDUCE=1"), std::string::npos) << both.status().to_string();
  unsetenv("MXSERVE_FUSED_ALLREDUCE");
}

}  // namespace
}  // namespace mxserve::cli
