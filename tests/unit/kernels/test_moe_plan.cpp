// MoE kernel plans (kernels/moe_plan.h), CPU only: a table parsed -> the plan built once -> choose(M) for
// every M, checked against the bucket rule select_moe_bucket (the oracle) including M <= 0, M past the largest
// bucket and huge M; untuned shapes (ONE warning with the exact tune-moe command, the heuristic for every M);
// buckets whose pair cannot run M (heuristic + one warning, also under concurrent calls); the start-up line
// and the /metrics rows. Also the MXFP4 variant list (kernels/cuda/moe_mxfp4/moe_mxfp4_variants.h, plain
// C++): name <-> id for every variant, and every shipped table (configs/moe) names only listed variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/moe_mxfp4/moe_mxfp4_variants.h"
#include "kernels/moe_plan.h"
#include "kernels/moe_tuning.h"

namespace mxserve::kernels {
namespace {

namespace fs = std::filesystem;
namespace kc = kernels::cuda;

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Variant names of the test tables (moe_tuning_data/*.json): gu_* (gate_up) and dn_* (down), ids 0..2.
int fake_index(int gemm, const std::string& name) {
  const std::vector<std::string> gu = {"gu_a", "gu_b", "gu_c"}, dn = {"dn_a", "dn_b", "dn_c"};
  const auto& v = gemm == 0 ? gu : dn;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == name) return static_cast<int>(i);
  return -1;
}

struct Captured {
  std::mutex mu;
  std::vector<std::string> info, warn;
};

MoeVariantCatalog catalog(std::function<int64_t(int, int, const MoeTuningKey&)> max_tokens = {}) {
  MoeVariantCatalog c;
  c.index = fake_index;
  c.max_tokens = max_tokens ? max_tokens : [](int, int, const MoeTuningKey&) { return kNoLimit; };
  return c;
}

MoeKernelPlanner make_planner(const MoeTuningSet* set, Captured* cap,
                              std::function<int64_t(int, int, const MoeTuningKey&)> max_tokens = {}) {
  return MoeKernelPlanner(
      set, nullptr, catalog(std::move(max_tokens)),
      [cap](const std::string& s) {
        std::lock_guard<std::mutex> l(cap->mu);
        cap->info.push_back(s);
      },
      [cap](const std::string& s) {
        std::lock_guard<std::mutex> l(cap->mu);
        cap->warn.push_back(s);
      });
}

// A table with buckets ms (ascending); bucket i runs g_i + d_i.
MoeTuningTable table_with(const std::vector<int64_t>& ms) {
  MoeTuningTable t;
  t.key = {"G", 8, 64, 32, 2, "mxfp4"};
  t.source = "t.json";
  for (size_t i = 0; i < ms.size(); ++i)
    t.entries.push_back({ms[i], "g_" + std::to_string(i), "d_" + std::to_string(i), 1.0});
  return t;
}

// Every M from -3 to 2 x the dense range, plus huge ones: the plan's pick == select_moe_bucket's (each
// bucket's own names resolve to its index, so a pick from the wrong bucket shows).
void expect_plan_matches_rule(const MoeTuningTable& t) {
  const MoeLogSink warn = [](const std::string&) {};
  const MoeVariantCatalog cat = {[&t](int gemm, const std::string& name) {
                                   for (size_t i = 0; i < t.entries.size(); ++i)
                                     if ((gemm == 0 ? t.entries[i].gate_up : t.entries[i].down) == name)
                                       return static_cast<int>(i);
                                   return -1;
                                 },
                                 [](int, int, const MoeTuningKey&) { return kNoLimit; }};
  const MoeKernelPlan plan(t.key, &t, cat, &warn);
  int64_t top = kMoePrefillMinM;
  for (const auto& e : t.entries) top = std::max(top, e.m);
  std::vector<int64_t> ms;
  for (int64_t m = -3; m <= 2 * top + 3; ++m) ms.push_back(m);
  for (int64_t m : {int64_t{1} << 20, int64_t{1} << 31, int64_t{1} << 40, kNoLimit}) ms.push_back(m);
  for (int64_t m : ms) {
    const int b = select_moe_bucket(t, m);
    const MoeChoice c = plan.choose(m);
    ASSERT_EQ(c.heuristic, b < 0) << t.source << " M " << m;
    if (b >= 0) {
      ASSERT_EQ(c.gate_up, cat.index(0, t.entries[b].gate_up)) << t.source << " M " << m;
      ASSERT_EQ(c.down, cat.index(1, t.entries[b].down)) << t.source << " M " << m;
    }
  }
}

TEST(MoeKernelPlan, EveryTokenCountPicksTheBucketRulesBucket) {
  for (const auto& ms : std::vector<std::vector<int64_t>>{
           {1, 16},                                     // decode only
           {2048},                                      // prefill only
           {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384},  // the shipped layout
           {2, 8, 100, 900, 1024, 3000},                // ties (M 4 between 2 and 8), every regime
           {64, 65, 1023, 1024},                        // regime edges
           {3, 5000},                                   // a large gap
           {}}) {                                       // a table without entries
    SCOPED_TRACE(::testing::PrintToString(ms));
    expect_plan_matches_rule(table_with(ms));
  }
}

TEST(MoeKernelPlan, ShippedTablesPickTheBucketRulesBucket) {
  const fs::path dir = fs::path(MXSERVE_SOURCE_DIR) / "configs/moe";
  int n = 0;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".json") continue;
    auto t = read_moe_tuning_file(f.path().string());
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    expect_plan_matches_rule(*t);
    ++n;
  }
  std::printf("checked %d shipped tables\n", n);
}

TEST(MoeKernelPlanner, MissingTableWarnsOncePerShape) {
  MoeTuningSet set;  // empty
  Captured cap;
  auto planner = make_planner(&set, &cap);
  const MoeTuningKey a{"NVIDIA H200", 128, 4096, 1408, 8, "mxfp4"};
  const MoeTuningKey b{"NVIDIA H200", 160, 5120, 1536, 8, "mxfp4"};
  const MoeKernelPlan& pa = planner.prepare(a);
  EXPECT_EQ(&planner.prepare(a), &pa);  // built once
  EXPECT_FALSE(pa.has_table());
  for (int64_t m : {int64_t{-1}, int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{500}, int64_t{4096},
                    int64_t{1} << 40})
    EXPECT_TRUE(pa.choose(m).heuristic) << m;
  ASSERT_EQ(cap.warn.size(), 1u);
  EXPECT_NE(cap.warn[0].find("NO TUNED TABLE"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[0].find("E128_H4096_I1408_K8_mxfp4"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[0].find("NVIDIA H200"), std::string::npos);
  EXPECT_NE(cap.warn[0].find("mxserve tune-moe --experts 128 --hidden 4096 --inter 1408 --top-k 8 --dtype mxfp4 "
                             "--out configs/moe/nvidia_h200_E128_H4096_I1408_K8_mxfp4.json"),
            std::string::npos)
      << cap.warn[0];
  EXPECT_TRUE(planner.prepare(b).choose(3).heuristic);
  planner.prepare(b);
  EXPECT_EQ(cap.warn.size(), 2u);  // one more for the second shape, never repeated
  EXPECT_TRUE(cap.info.empty());
  const auto rows = planner.rows();
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.bucket, "any");
    EXPECT_EQ(r.gate_up, "heuristic");
    EXPECT_EQ(r.down, "heuristic");
    EXPECT_EQ(r.source, "heuristic");
  }
  EXPECT_EQ(rows[0].shape, "E128_H4096_I1408_K8_mxfp4");
}

TEST(MoeKernelPlanner, TableChoicesPerBucketAndRows) {
  MoeTuningSet set;
  ASSERT_TRUE(set.add_embedded(embedded_moe_tables()).is_ok());
  Captured cap;
  auto planner = make_planner(&set, &cap);
  const MoeTuningKey k{"Test GPU", 8, 64, 32, 2, "mxfp4"};  // buckets m 1 (gu_a, dn_a) and 16 (gu_b, dn_b)
  const MoeKernelPlan& plan = planner.prepare(k);
  ASSERT_EQ(cap.info.size(), 1u);
  EXPECT_EQ(cap.info[0],
            "MoE kernels for 'Test GPU' E8_H64_I32_K2_mxfp4 from embedded:test_gpu_E8_H64_I32_K2_mxfp4.json: "
            "m1=gu_a+dn_a m16=gu_b+dn_b between=heuristic(no bucket) prefill=heuristic(no bucket) (regimes: decode "
            "M <= 64, between, prefill M >= 1024; a bucket is used only within its regime)");
  EXPECT_TRUE(cap.warn.empty());
  const MoeChoice c1 = plan.choose(1);
  EXPECT_FALSE(c1.heuristic);
  EXPECT_EQ(c1.gate_up, 0);
  EXPECT_EQ(c1.down, 0);
  EXPECT_EQ(plan.choose(3).gate_up, 0);  // |ln 3 - 0| = 1.10 < |ln 16 - ln 3| = 1.67
  const MoeChoice c12 = plan.choose(12);
  EXPECT_EQ(c12.gate_up, 1);
  EXPECT_EQ(c12.down, 1);
  EXPECT_EQ(plan.choose(64).gate_up, 1);        // the top of the decode regime
  EXPECT_TRUE(plan.choose(0).heuristic);        // no tokens: silent
  EXPECT_TRUE(plan.choose(-5).heuristic);
  EXPECT_TRUE(cap.warn.empty());
  EXPECT_TRUE(plan.choose(200).heuristic);      // between: no bucket of that regime
  EXPECT_TRUE(plan.choose(300).heuristic);
  EXPECT_TRUE(plan.choose(2048).heuristic);     // prefill: never the decode buckets
  EXPECT_TRUE(plan.choose(int64_t{1} << 40).heuristic);
  EXPECT_EQ(cap.info.size(), 1u);
  ASSERT_EQ(cap.warn.size(), 2u);  // once per regime without buckets, naming it
  EXPECT_NE(cap.warn[0].find("no between bucket"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[0].find(": 200 tokens"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[1].find("no prefill bucket"), std::string::npos) << cap.warn[1];
  EXPECT_NE(cap.warn[1].find("mxserve tune-moe --experts 8"), std::string::npos) << cap.warn[1];
  const auto rows = planner.rows();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].shape, "E8_H64_I32_K2_mxfp4");
  EXPECT_EQ(rows[0].bucket, "1");
  EXPECT_EQ(rows[0].gate_up, "gu_a");
  EXPECT_EQ(rows[0].down, "dn_a");
  EXPECT_EQ(rows[0].source, "table");
  EXPECT_EQ(rows[1].bucket, "16");
  EXPECT_EQ(rows[2].bucket, "between");
  EXPECT_EQ(rows[2].source, "heuristic");
  EXPECT_EQ(rows[3].bucket, "prefill");
}

TEST(MoeKernelPlanner, UnsupportedPairFallsBackWithOneWarning) {
  MoeTuningSet set;
  ASSERT_TRUE(set.add_embedded(embedded_moe_tables()).is_ok());
  Captured cap;
  // gu_b (id 1) runs this shape only up to 8 tokens; dn_b (id 1) up to 12.
  auto planner = make_planner(&set, &cap, [](int gemm, int v, const MoeTuningKey&) -> int64_t {
    if (v == 1) return gemm == 0 ? 8 : 12;
    return kNoLimit;
  });
  const MoeKernelPlan& plan = planner.prepare({"Test GPU", 8, 64, 32, 2, "mxfp4"});
  EXPECT_FALSE(plan.choose(6).heuristic);  // bucket 16, supported at 6 tokens
  EXPECT_FALSE(plan.choose(8).heuristic);
  EXPECT_TRUE(cap.warn.empty());
  EXPECT_TRUE(plan.choose(9).heuristic);
  EXPECT_TRUE(plan.choose(16).heuristic);
  EXPECT_TRUE(plan.choose(40).heuristic);
  ASSERT_EQ(cap.warn.size(), 1u);
  EXPECT_NE(cap.warn[0].find("bucket m 16 names gu_b+dn_b"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[0].find("at 9 tokens"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[0].find("heuristic"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[0].find("embedded:test_gpu_E8_H64_I32_K2_mxfp4.json"), std::string::npos) << cap.warn[0];
  EXPECT_NE(cap.warn[0].find("mxserve tune-moe --experts 8 --hidden 64"), std::string::npos) << cap.warn[0];
  EXPECT_FALSE(plan.choose(1).heuristic);  // the other bucket is unaffected
  const auto rows = planner.rows();
  ASSERT_EQ(rows.size(), 4u);  // buckets 1 and 16, and the between / prefill regimes the table lacks
  EXPECT_EQ(rows[0].source, "table");
  EXPECT_EQ(rows[1].bucket, "16");
  EXPECT_EQ(rows[1].source, "heuristic");
  EXPECT_EQ(rows[1].gate_up, "heuristic");
}

TEST(MoeKernelPlanner, ConcurrentCallsWarnOnce) {
  MoeTuningSet set;
  ASSERT_TRUE(set.add_embedded(embedded_moe_tables()).is_ok());
  Captured cap;
  auto planner = make_planner(&set, &cap, [](int, int v, const MoeTuningKey&) -> int64_t { return v == 1 ? 8 : kNoLimit; });
  const MoeKernelPlan& plan = planner.prepare({"Test GPU", 8, 64, 32, 2, "mxfp4"});
  std::atomic<int> table_picks{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      for (int64_t m = 1; m <= 3000; ++m) table_picks += plan.choose(m).heuristic ? 0 : 1;
      (void)planner.rows();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(table_picks.load(), 8 * 8);  // M 1..8 on the table, every other M the heuristic
  EXPECT_EQ(cap.warn.size(), 3u);        // bucket 16 unsupported, no between bucket, no prefill bucket
}

TEST(MoeKernelPlanner, PrefillOnlyTable) {
  MoeTuningSet set;
  ASSERT_TRUE(set.add_embedded(embedded_moe_tables()).is_ok());
  Captured cap;
  auto planner = make_planner(&set, &cap);
  const MoeKernelPlan& plan = planner.prepare({"Test GPU", 16, 128, 64, 4, "mxfp4"});  // one bucket, m 2048
  for (int64_t m : {int64_t{1024}, int64_t{2048}, int64_t{100000}, int64_t{1} << 50}) {
    const MoeChoice c = plan.choose(m);
    EXPECT_FALSE(c.heuristic) << m;
    EXPECT_EQ(c.gate_up, 2) << m;
    EXPECT_EQ(c.down, 2) << m;
  }
  EXPECT_TRUE(plan.choose(1).heuristic);
  EXPECT_TRUE(plan.choose(1023).heuristic);
  EXPECT_EQ(cap.warn.size(), 2u);  // no decode bucket, no between bucket
}

// ---- the MXFP4 variant list ----
TEST(MoeMxfp4Variants, NameAndIdRoundTripForEveryVariant) {
  ASSERT_GT(kc::kMoeMxfp4NumVariants, 0);
  std::set<std::string> names;
  std::set<kc::MoeMxfp4Design> designs;
  for (int v = 0; v < kc::kMoeMxfp4NumVariants; ++v) {
    const kc::MoeMxfp4VariantInfo& info = kc::kMoeMxfp4Variants[v];
    EXPECT_FALSE(info.name.empty()) << v;
    EXPECT_EQ(kc::moe_mxfp4_variant_id(info.name), v) << info.name;
    EXPECT_TRUE(names.insert(std::string(info.name)).second) << info.name;
    designs.insert(info.design);
  }
  // Every design id from 1 to the largest one in use has variants or is listed as retired (no silent hole left
  // by a removed design, and no retired number reused); a new design extends the range without editing this
  // test.
  const std::set<int> retired(std::begin(kc::kMoeMxfp4RetiredDesigns), std::end(kc::kMoeMxfp4RetiredDesigns));
  const int largest = std::max(static_cast<int>(*designs.rbegin()), *retired.rbegin());
  for (int d = 1; d <= largest; ++d)
    EXPECT_NE(designs.count(static_cast<kc::MoeMxfp4Design>(d)) > 0, retired.count(d) > 0) << "design " << d;
  EXPECT_EQ(designs.size() + retired.size(), static_cast<size_t>(largest));
  EXPECT_EQ(designs.size(), 5u);  // 2 tc, 4 pf, 5 gv, 6 wg, 8 wg8 (issue 31 retired 1 simt, 3 dec, 7 gva)
  EXPECT_EQ(kc::moe_mxfp4_variant_id("no_such_variant"), -1);
  EXPECT_EQ(kc::moe_mxfp4_variant_id(""), -1);
  EXPECT_EQ(kc::moe_mxfp4_variant_id("gv_w4_d4 "), -1);
  // The enum is generated from the same rows (a few spot checks of id <-> name <-> parameters).
  EXPECT_EQ(kc::kMoeMxfp4Variants[kc::moe_mxfp4_variant::kTcW64T8].name, "tc_w64_t8");
  EXPECT_EQ(kc::kMoeMxfp4Variants[kc::moe_mxfp4_variant::kGvW2D8K2].name, "gv_w2_d8_k2");
  EXPECT_EQ(kc::kMoeMxfp4Variants[kc::moe_mxfp4_variant::kGvW2D8K2].p1, 8);
  EXPECT_EQ(kc::kMoeMxfp4Variants[kc::moe_mxfp4_variant::kPfT128].design, kc::MoeMxfp4Design::kPf);
  EXPECT_EQ(kc::moe_mxfp4_variant_id("wg8_n128_s3_m256"), kc::moe_mxfp4_variant::kWg8N128S3M256);
  EXPECT_EQ(kc::kMoeMxfp4Variants[kc::moe_mxfp4_variant::kWg8N128S3M256].design, kc::MoeMxfp4Design::kWg8);
  EXPECT_EQ(kc::kMoeMxfp4Variants[kc::moe_mxfp4_variant::kWg8N128S3M256].p2, 256);
}

// Issue 31 retired designs 1, 3 and 7 (11 variants no table or rule picked): their names are not variants any
// more, are never reused, and a table naming one fails validation saying "retired" (naming the table file).
TEST(MoeMxfp4Variants, RetiredNamesAreRejectedAsRetired) {
  EXPECT_EQ(std::size(kc::kMoeMxfp4RetiredVariants), 11u);
  for (const kc::MoeMxfp4RetiredVariant& r : kc::kMoeMxfp4RetiredVariants) {
    EXPECT_EQ(kc::moe_mxfp4_variant_id(r.name), -1) << r.name;
    EXPECT_TRUE(kc::moe_mxfp4_variant_retired(r.name)) << r.name;
  }
  EXPECT_FALSE(kc::moe_mxfp4_variant_retired("gv_w4_d4"));
  EXPECT_FALSE(kc::moe_mxfp4_variant_retired("no_such_variant"));
  // The catalog's index as the CUDA backend builds it (moe_mxfp4_variant_index: -2 for a retired name).
  const auto index = [](int, const std::string& name) {
    const int v = kc::moe_mxfp4_variant_id(name);
    return v < 0 && kc::moe_mxfp4_variant_retired(name) ? kc::kMoeMxfp4RetiredVariant : v;
  };
  MoeTuningTable t;
  t.key = MoeTuningKey{"NVIDIA H200", 128, 4096, 1408, 8, "mxfp4"};
  t.source = "old_table.json";
  t.entries = {{1, "gv_w4_d4", "dec_s4_r4_o2", 10.0}};
  MoeTuningSet set;
  ASSERT_TRUE(set.add_tables({t}).is_ok());
  Status s = validate_moe_tuning(set, index);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("old_table.json"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("'dec_s4_r4_o2' was retired"), std::string::npos) << s.to_string();
  t.entries = {{1, "gv_w4_d4", "not_a_variant", 10.0}};
  MoeTuningSet set2;
  ASSERT_TRUE(set2.add_tables({t}).is_ok());
  s = validate_moe_tuning(set2, index);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("unknown down kernel variant 'not_a_variant'"), std::string::npos) << s.to_string();
}

TEST(MoeMxfp4Variants, ShippedTablesNameOnlyListedVariants) {
  MoeTuningSet set;
  const fs::path dir = fs::path(MXSERVE_SOURCE_DIR) / "configs/moe";
  ASSERT_TRUE(set.add_dir(dir.string()).is_ok());
  const Status s = validate_moe_tuning(set, [](int, const std::string& name) { return kc::moe_mxfp4_variant_id(name); });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

}  // namespace
}  // namespace mxserve::kernels
