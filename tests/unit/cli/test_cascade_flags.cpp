// parse_cascade_attention_flags (cli/cascade_flags.h): shared-prefix decode attention is ON by default in
// `mxserve serve`, --disable-cascade-attention turns it off, --enable-cascade-attention is a no-op alias of the
// default, both together are refused naming both flags; and the serving config the flags feed defaults to on and
// carries the choice into the backend options.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cascade_flags.h"
#include "server/serving_model.h"

namespace mxserve::cli {
namespace {

Result<bool> cascade_from(std::vector<std::string> a) {
  a.insert(a.begin(), "serve");
  std::vector<char*> ptrs;
  for (auto& s : a) ptrs.push_back(s.data());
  auto args = Args::parse(static_cast<int>(ptrs.size()), ptrs.data(), {}, kCascadeBoolFlags);
  if (!args.is_ok()) return args.status();
  return parse_cascade_attention_flags(*args);
}

TEST(CliCascadeFlags, OnByDefaultOffWhenDisabledEnableIsAnAlias) {
  auto def = cascade_from({});
  ASSERT_TRUE(def.is_ok());
  EXPECT_TRUE(*def);
  auto off = cascade_from({"--disable-cascade-attention"});
  ASSERT_TRUE(off.is_ok());
  EXPECT_FALSE(*off);
  auto on = cascade_from({"--enable-cascade-attention"});
  ASSERT_TRUE(on.is_ok());
  EXPECT_TRUE(*on);
}

TEST(CliCascadeFlags, BothIsAnError) {
  auto r = cascade_from({"--enable-cascade-attention", "--disable-cascade-attention"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("--enable-cascade-attention contradicts --disable-cascade-attention"),
            std::string::npos)
      << r.status().to_string();
}

TEST(CliCascadeFlags, ServingConfigDefaultsOnAndReachesTheBackend) {
  server::ServingConfig sc;
  EXPECT_TRUE(sc.cascade_attention);
  EXPECT_TRUE(sc.launch_config().backend_options.kernels.cascade_attention);
  sc.cascade_attention = false;
  EXPECT_FALSE(sc.launch_config().backend_options.kernels.cascade_attention);
}

}  // namespace
}  // namespace mxserve::cli
