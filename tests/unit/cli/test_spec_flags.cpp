// parse_spec_flags: sglang's speculative flags -> SpecConfig (chain, tree, benchmark mode), each bad
// combination refused with the flag named.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/spec_flags.h"

namespace mxserve::cli {
namespace {

Result<runtime::SpecConfig> spec_from(std::vector<std::string> a) {
  a.insert(a.begin(), "cmd");
  std::vector<char*> ptrs;
  for (auto& s : a) ptrs.push_back(s.data());
  auto args = Args::parse(static_cast<int>(ptrs.size()), ptrs.data(), kSpecValueFlags, kSpecBoolFlags);
  if (!args.is_ok()) return args.status();
  return parse_spec_flags(*args);
}

void expect_error(std::vector<std::string> a, const std::string& needle) {
  auto r = spec_from(a);
  ASSERT_FALSE(r.is_ok()) << "accepted; wanted an error containing: " << needle;
  EXPECT_NE(r.status().to_string().find(needle), std::string::npos) << r.status().to_string();
}

TEST(CliSpecFlags, OffByDefault) {
  auto r = spec_from({});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->num_steps, 0);
  EXPECT_FALSE(r->simulate_acceptance.has_value());
}

TEST(CliSpecFlags, ChainDefaultsAndAliases) {
  for (const char* algo : {"mtp", "MTP", "nextn", "NEXTN", "EAGLE"}) {
    auto r = spec_from({"--speculative-algorithm", algo});
    ASSERT_TRUE(r.is_ok()) << algo;
    EXPECT_EQ(r->num_steps, 3);
    EXPECT_EQ(r->topk, 1);
    EXPECT_FALSE(r->tree());
    EXPECT_TRUE(r->adaptive);
    EXPECT_TRUE(r->self_test);
  }
  auto r = spec_from({"--speculative-algorithm", "mtp", "--speculative-num-steps", "5", "--speculative-num-draft-tokens",
                      "6", "--no-speculative-adaptive", "--speculative-skip-self-test"});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->num_steps, 5);
  EXPECT_FALSE(r->adaptive);
  EXPECT_FALSE(r->self_test);
}

TEST(CliSpecFlags, FlagsWithoutAlgorithmAreRefused) {
  for (const char* f : {"--speculative-num-steps", "--speculative-simulate-acceptance", "--speculative-eagle-topk",
                        "--speculative-num-draft-tokens"})
    expect_error({f, "2"}, std::string(f) + " needs --speculative-algorithm mtp");
  expect_error({"--speculative-skip-self-test"}, "--speculative-skip-self-test needs --speculative-algorithm mtp");
}

TEST(CliSpecFlags, Ranges) {
  expect_error({"--speculative-algorithm", "medusa"}, "--speculative-algorithm 'medusa'");
  expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "0"}, "must be in [1, 16]");
  expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "17"}, "must be in [1, 16]");
  expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "2x"}, "'2x' is not an integer");
  expect_error({"--speculative-algorithm", "mtp", "--speculative-eagle-topk", "17"}, "--speculative-eagle-topk must be");
  // Chain mode: num_draft_tokens is the drafts plus the verified token, nothing else.
  expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "5"},
               "it must be --speculative-num-steps + 1 = 4");
}

TEST(CliSpecFlags, TreeMode) {
  auto r = spec_from({"--speculative-algorithm", "mtp", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                      "--speculative-num-draft-tokens", "8"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->tree());
  EXPECT_EQ(r->num_draft_tokens, 8);
  // Default: 1 + min(N * K, capacity) = 1 + min(12, 4 + 2 * 16) = 13.
  auto d = spec_from({"--speculative-algorithm", "mtp", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4"});
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->num_draft_tokens, 13);
  expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--speculative-eagle-topk", "2",
                "--speculative-num-draft-tokens", "8"},
               "a tree of depth 1 with topk 2 holds at most 2 nodes");
  expect_error({"--speculative-algorithm", "mtp", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "1"},
               "in [1, 64]");
  expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "6", "--speculative-eagle-topk", "16",
                "--speculative-num-draft-tokens", "10"},
               "(steps - 1) * topk <= 64");
  // Its default num_draft_tokens (1 + min(96, capacity) = 97) is refused first, naming the node limit.
  expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "6", "--speculative-eagle-topk", "16"},
               "--speculative-num-draft-tokens 97: tree mode verifies num_draft_tokens - 1 draft nodes, in [1, 64]");
}

TEST(CliSpecFlags, SimulatedAcceptance) {
  auto r = spec_from({"--speculative-algorithm", "mtp", "--speculative-num-steps", "3",
                      "--speculative-simulate-acceptance", "2.5"});
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(r->simulate_acceptance.has_value());
  EXPECT_DOUBLE_EQ(*r->simulate_acceptance, 2.5);
  for (const char* bad : {"0.5", "4.01", "nan"})
    expect_error({"--speculative-algorithm", "mtp", "--speculative-num-steps", "3", "--speculative-simulate-acceptance", bad},
                 "--speculative-simulate-acceptance must be in [1, num_steps + 1]");
}

}  // namespace
}  // namespace mxserve::cli
