// Decode attention split tables (kernels/attention_tuning.h, kernels/attention_split_table.h): the format
// round-trips, bad tables are refused naming the field, the lookup snaps to the nearest bucket on a log
// scale and refuses (0: heuristic) beyond the grid or for an untuned table; the embedded set parses.
#include <gtest/gtest.h>

#include "kernels/attention_tuning.h"

namespace mxserve::kernels {
namespace {

AttentionSplitTable sample_table() {
  AttentionSplitTable t;
  t.key = {"NVIDIA H200", "bf16", 96, 8, 128};
  t.tuned = true;
  t.command = "mxserve tune-attention --heads 96";
  t.rows = {1, 8, 64};
  t.contexts = {1024, 8192, 131072};
  t.n_splits = {8, 32, 128,  //
                4, 16, 64,   //
                1, 2, 8};
  t.us = {5, 9, 80, 6, 20, 300, 8, 90, 2000.5};
  return t;
}

TEST(AttentionTuning, JsonRoundTrip) {
  const AttentionSplitTable t = sample_table();
  const std::string text = attention_tuning_json(t);
  auto back = parse_attention_tuning_table(text, "t.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->key, t.key);
  EXPECT_TRUE(back->tuned);
  EXPECT_EQ(back->command, t.command);
  EXPECT_EQ(back->rows, t.rows);
  EXPECT_EQ(back->contexts, t.contexts);
  EXPECT_EQ(back->n_splits, t.n_splits);
  EXPECT_EQ(back->us, t.us);
  EXPECT_EQ(back->source, "t.json");
  EXPECT_EQ(attention_tuning_file_name(t.key), "nvidia_h200_Q96_KV8_D128_bf16.json");
  EXPECT_NE(attention_tune_command(t.key).find("--kv-cache-dtype bf16 --out configs/attention/"
                                               "nvidia_h200_Q96_KV8_D128_bf16.json"),
            std::string::npos);
}

TEST(AttentionTuning, BadTablesNameTheField) {
  const std::string good = attention_tuning_json(sample_table());
  auto expect_error = [&](const std::string& from, const std::string& to, const std::string& needle) {
    std::string text = good;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    auto r = parse_attention_tuning_table(text, "bad.json");
    ASSERT_FALSE(r.is_ok()) << "accepted: " << to;
    EXPECT_NE(r.status().to_string().find(needle), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().to_string().find("bad.json"), std::string::npos) << r.status().to_string();
  };
  expect_error("mxserve-attention-tuning/1", "mxserve-attention-tuning/9", "format");
  expect_error("\"bf16\"", "\"fp16\"", "kv_cache_dtype");
  expect_error("\"tuned\"", "\"maybe\"", "status");
  expect_error("\"n_kv_heads\": 8", "\"n_kv_heads\": 7", "n_heads");
  expect_error("1024,", "9999,", "contexts");  // not ascending
  expect_error("128\n", "0\n", "n_splits");    // a split count of 0
  auto r = parse_attention_tuning_table("{", "x.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("x.json"), std::string::npos);
}

TEST(AttentionTuning, LookupNearestBucketAndOutside) {
  const AttentionSplitTable t = sample_table();
  EXPECT_EQ(lookup_attention_splits(t, 1, 1024), 8);
  EXPECT_EQ(lookup_attention_splits(t, 8, 8192), 16);
  EXPECT_EQ(lookup_attention_splits(t, 2, 1500), 8);      // rows 2 -> 1 (log 2 < log 4); 1500 -> 1024
  EXPECT_EQ(lookup_attention_splits(t, 3, 20000), 16);    // rows 3 -> 8? |ln 3 - ln 1| = 1.10 > |ln 3 - ln 8| = 0.98
  EXPECT_EQ(lookup_attention_splits(t, 64, 100), 1);      // below the smallest context: its bucket
  EXPECT_EQ(lookup_attention_splits(t, 64, 131072), 8);
  EXPECT_EQ(lookup_attention_splits(t, 65, 1024), 0) << "more rows than the largest bucket: outside";
  EXPECT_EQ(lookup_attention_splits(t, 1, 131073), 0) << "a longer context than the largest bucket: outside";
  AttentionSplitTable untuned = t;
  untuned.tuned = false;
  EXPECT_EQ(lookup_attention_splits(untuned, 8, 8192), 0) << "an untuned table is never used";
}

TEST(AttentionTuning, EmbeddedTablesParse) {
  auto tables = parse_embedded_attention_tables(embedded_attention_tables());
  ASSERT_TRUE(tables.is_ok()) << tables.status().to_string();
  EXPECT_EQ(tables->size(), embedded_attention_tables().size());
  EXPECT_EQ(find_attention_split_table({"no such GPU", "bf16", 96, 8, 128}), nullptr);
  std::printf("[ embedded ] %zu attention tuning table(s) in configs/attention/\n", tables->size());
}

}  // namespace
}  // namespace mxserve::kernels
