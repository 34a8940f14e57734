// parse_kv_pool_flags (cli/kv_pool_flags.h): `mxserve serve` on CUDA sizes the KV pool from the device by default
// (as --gpu-memory-utilization 0.9, vLLM's and sglang's default), a named --kv-cache-memory or --num-kv-blocks
// keeps its size, the CPU keeps 1 GiB, and bad values are refused naming the flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/kv_pool_flags.h"

namespace mxserve::cli {
namespace {

Result<server::ServingConfig> pool_from(const std::string& backend, std::vector<std::string> a) {
  a.insert(a.begin(), "serve");
  std::vector<char*> ptrs;
  for (auto& s : a) ptrs.push_back(s.data());
  auto args = Args::parse(static_cast<int>(ptrs.size()), ptrs.data(),
                          {"--kv-cache-memory", "--gpu-memory-utilization", "--num-kv-blocks"}, {});
  if (!args.is_ok()) return args.status();
  server::ServingConfig sc;
  sc.backend = backend;
  if (Status st = parse_kv_pool_flags(*args, sc); !st.is_ok()) return st;
  return sc;
}

TEST(CliKvPoolFlags, CudaSizesThePoolFromTheDeviceByDefault) {
  auto sc = pool_from("cuda", {});
  ASSERT_TRUE(sc.is_ok()) << sc.status().to_string();
  EXPECT_TRUE(sc->gpu_memory_utilization_given);
  EXPECT_FALSE(sc->kv_cache_bytes_given);
  EXPECT_DOUBLE_EQ(sc->gpu_memory_utilization, 0.9);
  auto util = pool_from("cuda", {"--gpu-memory-utilization", "0.8"});
  ASSERT_TRUE(util.is_ok());
  EXPECT_TRUE(util->gpu_memory_utilization_given);
  EXPECT_DOUBLE_EQ(util->gpu_memory_utilization, 0.8);
}

TEST(CliKvPoolFlags, NamedSizesAndTheCpuKeepTheirPool) {
  auto named = pool_from("cuda", {"--kv-cache-memory", "4GiB"});
  ASSERT_TRUE(named.is_ok());
  EXPECT_TRUE(named->kv_cache_bytes_given);
  EXPECT_FALSE(named->gpu_memory_utilization_given) << "a named size is checked against the device, never resized";
  EXPECT_EQ(named->kv_cache_bytes, uint64_t{4} << 30);
  auto blocks = pool_from("cuda", {"--num-kv-blocks", "100"});
  ASSERT_TRUE(blocks.is_ok());
  EXPECT_FALSE(blocks->gpu_memory_utilization_given);
  auto cpu = pool_from("cpu", {});
  ASSERT_TRUE(cpu.is_ok());
  EXPECT_FALSE(cpu->gpu_memory_utilization_given);
  EXPECT_EQ(cpu->kv_cache_bytes, uint64_t{1} << 30);
}

TEST(CliKvPoolFlags, BadValuesNameTheFlag) {
  auto unit = pool_from("cuda", {"--kv-cache-memory", "12XB"});
  ASSERT_FALSE(unit.is_ok());
  EXPECT_NE(unit.status().message().find("--kv-cache-memory"), std::string::npos) << unit.status().message();
  EXPECT_NE(unit.status().message().find("12XB"), std::string::npos) << unit.status().message();
  for (const char* bad : {"0", "1.5", "abc"}) {
    auto util = pool_from("cuda", {"--gpu-memory-utilization", bad});
    ASSERT_FALSE(util.is_ok()) << bad;
    EXPECT_NE(util.status().message().find("--gpu-memory-utilization"), std::string::npos) << util.status().message();
  }
}

}  // namespace
}  // namespace mxserve::cli
