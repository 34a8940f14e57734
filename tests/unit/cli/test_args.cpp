// cli::Args and parse_id_list: every flag declared, values strict, errors name the flag and the value.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/command_table.h"

namespace mxserve::cli {
namespace {

// argv from strings (argv[0] is the subcommand name, as main passes it).
struct Argv {
  explicit Argv(std::vector<std::string> a) : strings(std::move(a)) {
    strings.insert(strings.begin(), "cmd");
    for (auto& s : strings) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> strings;
  std::vector<char*> ptrs;
};

Result<Args> parse(std::vector<std::string> a) {
  Argv v(std::move(a));
  return Args::parse(v.argc(), v.argv(), {"--model", "--n", "--x"}, {"--flag"});
}

TEST(CliArgs, ValuesSpaceOrEquals) {
  auto a = parse({"--model", "dir", "--n=7", "--flag", "pos"});
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(*a->get("--model"), "dir");
  EXPECT_EQ(*a->get_int("--n", 0), 7);
  EXPECT_TRUE(a->has("--flag"));
  EXPECT_FALSE(a->has("--x"));
  ASSERT_EQ(a->positional().size(), 1u);
  EXPECT_EQ(a->positional()[0], "pos");
  // "--x=" is an explicit empty value, and a value may contain '='.
  auto b = parse({"--x=", "--model=a=b"});
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(*b->get("--x"), "");
  EXPECT_EQ(*b->get("--model"), "a=b");
}

TEST(CliArgs, DefaultsAndMissing) {
  auto a = parse({});
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(*a->get_int("--n", 42), 42);
  EXPECT_DOUBLE_EQ(*a->get_double("--x", 1.5), 1.5);
  EXPECT_EQ(a->get_or("--model", "fallback"), "fallback");
  auto m = a->get("--model");
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().to_string().find("missing required flag --model"), std::string::npos);
}

TEST(CliArgs, UnknownFlagNamesItAndTheNearestOne) {
  auto a = parse({"--model", "d", "--bogus", "3"});
  ASSERT_FALSE(a.is_ok());
  const std::string msg = a.status().to_string();
  EXPECT_NE(msg.find("unknown flag --bogus ("), std::string::npos) << msg;
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;  // nothing is near --bogus
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;            // one line, no flag list
  auto typo = parse({"--modle", "d"});
  ASSERT_FALSE(typo.is_ok());
  EXPECT_NE(typo.status().to_string().find("unknown flag --modle (did you mean --model?"), std::string::npos)
      << typo.status().to_string();
  // A single dash is a positional argument, not a flag.
  auto b = parse({"-x"});
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->positional().at(0), "-x");
}

TEST(CliArgs, MissingValueAndValueOnABool) {
  auto a = parse({"--model"});
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().to_string().find("flag --model needs a value"), std::string::npos);
  auto b = parse({"--flag=1"});
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().to_string().find("flag --flag takes no value"), std::string::npos);
}

TEST(CliArgs, StrictNumbers) {
  for (const char* bad : {"3x", "", "x", " ", "99999999999999999999", "1.5"}) {
    auto a = parse({std::string("--n=") + bad});
    ASSERT_TRUE(a.is_ok());
    auto v = a->get_int("--n", 0);
    ASSERT_FALSE(v.is_ok()) << "'" << bad << "' parsed as " << *v;
    EXPECT_NE(v.status().to_string().find("flag --n: '" + std::string(bad) + "' is not an integer"), std::string::npos)
        << v.status().to_string();
  }
  for (const char* bad : {"1.5.2", "", "abc", "1e999", "2x"}) {
    auto a = parse({std::string("--x=") + bad});
    auto v = a->get_double("--x", 0);
    ASSERT_FALSE(v.is_ok()) << "'" << bad << "' parsed as " << *v;
    EXPECT_NE(v.status().to_string().find("is not a number"), std::string::npos);
  }
  auto a = parse({"--n=-12", "--x=2.5e-3"});
  EXPECT_EQ(*a->get_int("--n", 0), -12);
  EXPECT_DOUBLE_EQ(*a->get_double("--x", 0), 2.5e-3);
}

TEST(CliArgs, LastValueWins) {
  auto a = parse({"--n", "1", "--n", "2"});
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(*a->get_int("--n", 0), 2);
}

TEST(CliIdList, ParsesAndRejects) {
  auto ok = parse_id_list("1,22,333", "--ids");
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, (std::vector<int32_t>{1, 22, 333}));
  for (const char* bad : {"", "1,,2", "1,x", "-1", "1,", "2147483648", "1 ,2"}) {
    auto r = parse_id_list(bad, "--ids");
    ASSERT_FALSE(r.is_ok()) << "'" << bad << "' parsed";
    EXPECT_NE(r.status().to_string().find("flag --ids:"), std::string::npos);
  }
  auto r = parse_id_list("1,x,3", "--ids");
  EXPECT_NE(r.status().to_string().find("'x' is not a token id"), std::string::npos);
}

TEST(CliArgs, EditDistanceAndNearestName) {
  EXPECT_EQ(edit_distance("--port", "--prot"), 2u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(nearest_name("--max-token", {"--max-tokens", "--model"}), "--max-tokens");
  EXPECT_EQ(nearest_name("--zzzzzz", {"--max-tokens", "--model"}), "");
}

}  // namespace
}  // namespace mxserve::cli
