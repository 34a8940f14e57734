// MoE tuning tables (kernels/moe_tuning.h): the reader (every malformed field -> an error naming the file and
// the field), the regime-safe bucket rule, table sets (directories, overrides, duplicates), name validation
// and the build-time embedding (this test embeds moe_tuning_data/*.json through the same CMake generator).
// The load-time plans built from the tables: test_moe_plan.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/moe_tuning.h"

namespace mxserve::kernels {
namespace {

namespace fs = std::filesystem;

nlohmann::json good_json() {
  return nlohmann::json::parse(R"({"format":"mxserve-moe-tuning/1","gpu":"NVIDIA H200","experts":128,"hidden":4096,
    "inter":1408,"top_k":8,"dtype":"mxfp4","command":"mxserve tune-moe ...",
    "entries":[{"m":16,"gate_up":"mma_a","down":"mma_b","us":20.5},{"m":1,"gate_up":"gemv_r4","down":"gemv_r2","us":12.3}]})");
}

TEST(MoeTuningReader, ParsesAGoodTableSortedByM) {
  auto t = parse_moe_tuning_table(good_json().dump(), "good.json");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->key.gpu, "NVIDIA H200");
  EXPECT_EQ(t->key.experts, 128);
  EXPECT_EQ(t->key.hidden, 4096);
  EXPECT_EQ(t->key.inter, 1408);
  EXPECT_EQ(t->key.top_k, 8);
  EXPECT_EQ(t->key.dtype, "mxfp4");
  EXPECT_EQ(t->command, "mxserve tune-moe ...");
  EXPECT_EQ(t->source, "good.json");
  ASSERT_EQ(t->entries.size(), 2u);
  EXPECT_EQ(t->entries[0].m, 1);
  EXPECT_EQ(t->entries[0].gate_up, "gemv_r4");
  EXPECT_EQ(t->entries[0].down, "gemv_r2");
  EXPECT_DOUBLE_EQ(t->entries[0].us, 12.3);
  EXPECT_EQ(t->entries[1].m, 16);
}

TEST(MoeTuningReader, KeyNamesAndTuneCommand) {
  MoeTuningKey k{"NVIDIA H200", 128, 4096, 1408, 8, "mxfp4"};
  EXPECT_EQ(k.shape_label(), "E128_H4096_I1408_K8_mxfp4");
  EXPECT_EQ(k.file_name(), "nvidia_h200_E128_H4096_I1408_K8_mxfp4.json");
  EXPECT_EQ(k.tune_command(),
            "mxserve tune-moe --experts 128 --hidden 4096 --inter 1408 --top-k 8 --dtype mxfp4 "
            "--out configs/moe/nvidia_h200_E128_H4096_I1408_K8_mxfp4.json");
}

struct Malformed {
  const char* what;
  std::function<void(nlohmann::json&)> edit;
  std::vector<std::string> must_name;  // substrings of the error besides the file name
};

TEST(MoeTuningReader, EveryMalformedFieldIsNamed) {
  const std::vector<Malformed> cases = {
      {"format wrong", [](auto& j) { j["format"] = "mxserve-moe-tuning/2"; }, {"'format'", "mxserve-moe-tuning/2"}},
      {"format missing", [](auto& j) { j.erase("format"); }, {"'format'", "missing"}},
      {"gpu missing", [](auto& j) { j.erase("gpu"); }, {"'gpu'"}},
      {"gpu empty", [](auto& j) { j["gpu"] = ""; }, {"'gpu'", "non-empty"}},
      {"gpu not a string", [](auto& j) { j["gpu"] = 3; }, {"'gpu'", "3"}},
      {"experts zero", [](auto& j) { j["experts"] = 0; }, {"'experts'", "positive"}},
      {"experts string", [](auto& j) { j["experts"] = "128"; }, {"'experts'", "\"128\""}},
      {"hidden negative", [](auto& j) { j["hidden"] = -4096; }, {"'hidden'", "-4096"}},
      {"hidden fractional", [](auto& j) { j["hidden"] = 40.5; }, {"'hidden'", "40.5"}},
      {"inter missing", [](auto& j) { j.erase("inter"); }, {"'inter'"}},
      {"top_k missing", [](auto& j) { j.erase("top_k"); }, {"'top_k'"}},
      {"top_k above experts", [](auto& j) { j["top_k"] = 129; }, {"'top_k'", "129"}},
      {"dtype bf16", [](auto& j) { j["dtype"] = "bf16"; }, {"'dtype'", "bf16"}},
      {"dtype missing", [](auto& j) { j.erase("dtype"); }, {"'dtype'"}},
      {"command not a string", [](auto& j) { j["command"] = 5; }, {"'command'"}},
      {"entries missing", [](auto& j) { j.erase("entries"); }, {"'entries'"}},
      {"entries not a list", [](auto& j) { j["entries"] = nlohmann::json::object(); }, {"'entries'"}},
      {"entry not an object", [](auto& j) { j["entries"][1] = 7; }, {"entries[1]", "7"}},
      {"m missing", [](auto& j) { j["entries"][0].erase("m"); }, {"entries[0]", "'m'"}},
      {"m zero", [](auto& j) { j["entries"][1]["m"] = 0; }, {"entries[1]", "'m'", "positive"}},
      {"m duplicate", [](auto& j) { j["entries"][1]["m"] = 16; }, {"entries[1]", "'m'", "duplicate"}},
      {"m above the largest bucket", [](auto& j) { j["entries"][1]["m"] = (1 << 20) + 1; },
       {"entries[1]", "'m'", "at most 1048576", "1048577"}},
      {"too many buckets",
       [](auto& j) {
         for (int m = 100; m < 1200; ++m) j["entries"].push_back({{"m", m}, {"gate_up", "a"}, {"down", "b"}, {"us", 1}});
       },
       {"'entries'", "at most 1024 buckets", "1102"}},
      {"gate_up missing", [](auto& j) { j["entries"][0].erase("gate_up"); }, {"entries[0]", "'gate_up'"}},
      {"gate_up empty", [](auto& j) { j["entries"][1]["gate_up"] = ""; }, {"entries[1]", "'gate_up'"}},
      {"down not a string", [](auto& j) { j["entries"][0]["down"] = 1; }, {"entries[0]", "'down'"}},
      {"us missing", [](auto& j) { j["entries"][1].erase("us"); }, {"entries[1]", "'us'"}},
      {"us negative", [](auto& j) { j["entries"][0]["us"] = -1.0; }, {"entries[0]", "'us'", "-1"}},
      {"us string", [](auto& j) { j["entries"][0]["us"] = "fast"; }, {"entries[0]", "'us'", "fast"}},
  };
  for (const auto& c : cases) {
    nlohmann::json j = good_json();
    c.edit(j);
    auto t = parse_moe_tuning_table(j.dump(), "configs/moe/bad.json");
    ASSERT_FALSE(t.is_ok()) << c.what;
    const std::string msg = t.status().message();
    EXPECT_NE(msg.find("configs/moe/bad.json"), std::string::npos) << c.what << ": " << msg;
    for (const auto& s : c.must_name) EXPECT_NE(msg.find(s), std::string::npos) << c.what << ": '" << s << "' in " << msg;
  }
}

TEST(MoeTuningReader, NotJsonNotAnObjectMissingFile) {
  auto a = parse_moe_tuning_table("{\"format\": ", "t.json");
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("t.json: not valid JSON"), std::string::npos);
  auto b = parse_moe_tuning_table("[1, 2]", "t.json");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("t.json: expected a JSON object"), std::string::npos);
  auto c = read_moe_tuning_file("/nonexistent/moe.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("/nonexistent/moe.json"), std::string::npos);
}

// ---- bucket rule ----
MoeTuningTable table_with(const std::vector<int64_t>& ms) {
  MoeTuningTable t;
  t.key = {"G", 8, 64, 32, 2, "mxfp4"};
  t.source = "t.json";
  for (int64_t m : ms) t.entries.push_back({m, "gu" + std::to_string(m), "dn" + std::to_string(m), 1.0});
  return t;
}

int64_t bucket_m(const MoeTuningTable& t, int64_t m) {
  const int i = select_moe_bucket(t, m);
  return i < 0 ? -1 : t.entries[i].m;
}

TEST(MoeBucketRule, Regimes) {
  EXPECT_EQ(moe_regime(1), MoeRegime::kDecode);
  EXPECT_EQ(moe_regime(64), MoeRegime::kDecode);
  EXPECT_EQ(moe_regime(65), MoeRegime::kBetween);
  EXPECT_EQ(moe_regime(1023), MoeRegime::kBetween);
  EXPECT_EQ(moe_regime(1024), MoeRegime::kPrefill);
  EXPECT_EQ(moe_regime(1 << 20), MoeRegime::kPrefill);
}

TEST(MoeBucketRule, ExactAndLogNearest) {
  const auto t = table_with({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192});
  for (int64_t m : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}) EXPECT_EQ(bucket_m(t, m), m);
  EXPECT_EQ(bucket_m(t, 3), 4);      // |ln 3 - ln 4| = 0.29 < |ln 3 - ln 2| = 0.41
  EXPECT_EQ(bucket_m(t, 5), 4);      // 0.22 < 0.47
  EXPECT_EQ(bucket_m(t, 6), 8);      // 0.29 < 0.41
  EXPECT_EQ(bucket_m(t, 100), 128);  // 0.25 < 0.45
  EXPECT_EQ(bucket_m(t, 90), 128);   // 64 would be nearer (0.34 < 0.35) but is a decode bucket; M = 90 is between
  EXPECT_EQ(bucket_m(table_with({64, 256}), 70), 256);  // 64 is 8% away but of the decode regime
  EXPECT_EQ(bucket_m(t, 3000), 4096);
  EXPECT_EQ(bucket_m(t, 100000), 8192);  // beyond the largest bucket: the largest of its regime
}

TEST(MoeBucketRule, TiesGoToTheSmallerBucket) {
  const auto t = table_with({2, 8});
  EXPECT_EQ(bucket_m(t, 4), 2);  // ln 4 is exactly between ln 2 and ln 8
}

TEST(MoeBucketRule, GapsNeverCrossRegimes) {
  // Only decode buckets: a prefill-size or between-size M runs the heuristic, not the 64-token config.
  const auto decode_only = table_with({1, 8, 64});
  EXPECT_EQ(bucket_m(decode_only, 40), 64);
  EXPECT_EQ(bucket_m(decode_only, 65), -1);
  EXPECT_EQ(bucket_m(decode_only, 1023), -1);
  EXPECT_EQ(bucket_m(decode_only, 1024), -1);
  EXPECT_EQ(bucket_m(decode_only, 8192), -1);
  // Only prefill buckets: decode never uses them.
  const auto prefill_only = table_with({1024, 4096});
  EXPECT_EQ(bucket_m(prefill_only, 1), -1);
  EXPECT_EQ(bucket_m(prefill_only, 64), -1);
  EXPECT_EQ(bucket_m(prefill_only, 1000), -1);
  EXPECT_EQ(bucket_m(prefill_only, 1024), 1024);
  EXPECT_EQ(bucket_m(prefill_only, 100000), 4096);
  // A far decode bucket is still used for any decode M (same regime), a between bucket only between.
  const auto sparse = table_with({1, 256, 8192});
  EXPECT_EQ(bucket_m(sparse, 64), 1);
  EXPECT_EQ(bucket_m(sparse, 65), 256);
  EXPECT_EQ(bucket_m(sparse, 1023), 256);
  EXPECT_EQ(bucket_m(sparse, 1024), 8192);
}

TEST(MoeBucketRule, EmptyTableAndBadM) {
  const auto empty = table_with({});
  EXPECT_EQ(select_moe_bucket(empty, 1), -1);
  EXPECT_EQ(select_moe_bucket(empty, 4096), -1);
  EXPECT_EQ(select_moe_bucket(table_with({1}), 0), -1);
}

// ---- sets ----
fs::path scratch(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("mxserve_moetune_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(); }

TEST(MoeTuningSet, DirectoryAddsAndOverrides) {
  MoeTuningSet set;
  ASSERT_TRUE(set.add_embedded(embedded_moe_tables()).is_ok());
  const MoeTuningKey k8{"Test GPU", 8, 64, 32, 2, "mxfp4"};
  ASSERT_NE(set.find(k8), nullptr);
  EXPECT_EQ(set.find(k8)->entries.size(), 2u);
  const fs::path dir = scratch("override");
  nlohmann::json j = nlohmann::json::parse(R"({"format":"mxserve-moe-tuning/1","gpu":"Test GPU","experts":8,"hidden":64,
      "inter":32,"top_k":2,"dtype":"mxfp4","entries":[{"m":4,"gate_up":"x","down":"y","us":1}]})");
  write(dir / "override.json", j);
  j["gpu"] = "Other GPU";
  write(dir / "other.json", j);
  std::ofstream(dir / "notes.txt") << "not a table";
  ASSERT_TRUE(set.add_dir(dir.string()).is_ok());
  EXPECT_EQ(set.size(), 3u);  // two embedded + one new key; the overridden key is replaced
  ASSERT_NE(set.find(k8), nullptr);
  EXPECT_EQ(set.find(k8)->source, (dir / "override.json").string());
  EXPECT_EQ(set.find(k8)->entries.size(), 1u);
  fs::remove_all(dir);
}

TEST(MoeTuningSet, DirectoryErrorsNameTheFile) {
  MoeTuningSet set;
  auto missing = set.add_dir("/nonexistent/moe-dir");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find("/nonexistent/moe-dir"), std::string::npos);

  const fs::path dir = scratch("bad");
  nlohmann::json j = good_json();
  j["entries"][0]["us"] = "slow";
  write(dir / "bad.json", j);
  auto bad = set.add_dir(dir.string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find((dir / "bad.json").string()), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("'us'"), std::string::npos) << bad.message();

  fs::remove(dir / "bad.json");
  write(dir / "a.json", good_json());
  write(dir / "b.json", good_json());
  auto dup = set.add_dir(dir.string());
  ASSERT_FALSE(dup.is_ok());
  EXPECT_NE(dup.message().find("a.json"), std::string::npos) << dup.message();
  EXPECT_NE(dup.message().find("b.json"), std::string::npos) << dup.message();
  fs::remove_all(dir);
}

// The generator embedded this directory's moe_tuning_data/*.json in this binary, in name order.
TEST(MoeTuningSet, EmbeddedTablesAreFound) {
  const auto& files = embedded_moe_tables();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_STREQ(files[0].name, "test_gpu_E16_H128_I64_K4_mxfp4.json");
  EXPECT_STREQ(files[1].name, "test_gpu_E8_H64_I32_K2_mxfp4.json");
  std::ifstream in(fs::path(MXSERVE_SOURCE_DIR) / "tests/unit/kernels/moe_tuning_data" / files[1].name, std::ios::binary);
  const std::string on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::string(files[1].text, files[1].size), on_disk);  // byte for byte
  MoeTuningSet set;
  ASSERT_TRUE(set.add_embedded(files).is_ok());
  const MoeTuningTable* t = set.find({"Test GPU", 16, 128, 64, 4, "mxfp4"});
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source, "embedded:test_gpu_E16_H128_I64_K4_mxfp4.json");
  EXPECT_EQ(global_moe_tuning().size(), 2u);  // the process-wide set starts from the embedded tables
}

// ---- validation ----
int fake_index(int gemm, const std::string& name) {
  const std::vector<std::string> gu = {"gu_a", "gu_b", "gu_c"}, dn = {"dn_a", "dn_b", "dn_c"};
  const auto& v = gemm == 0 ? gu : dn;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == name) return static_cast<int>(i);
  return -1;
}

TEST(MoeTuningValidate, UnknownVariantNamesTheTableAndName) {
  MoeTuningSet set;
  ASSERT_TRUE(set.add_embedded(embedded_moe_tables()).is_ok());
  EXPECT_TRUE(validate_moe_tuning(set, fake_index).is_ok());
  auto t = parse_moe_tuning_table(R"({"format":"mxserve-moe-tuning/1","gpu":"G","experts":8,"hidden":64,"inter":32,
      "top_k":2,"dtype":"mxfp4","entries":[{"m":1,"gate_up":"gu_a","down":"dn_renamed","us":1}]})",
                                  "/tables/g.json");
  ASSERT_TRUE(t.is_ok());
  ASSERT_TRUE(set.add_tables({*t}).is_ok());
  Status s = validate_moe_tuning(set, fake_index);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("/tables/g.json"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'dn_renamed'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("down"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace mxserve::kernels
