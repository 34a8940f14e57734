// Randomized mutation test of the safetensors header parser: starting from valid images, flip bytes,
// splice tokens, truncate and extend; the parser must return a Status (ok or error) every time --
// never crash, hang or read out of bounds (run under ASan/valgrind to check the latter too).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace mxserve::io {
namespace {

std::vector<std::string> seeds() {
  auto t = [](DType dt, Shape s) {
    Tensor x = Tensor::empty(dt, std::move(s));
    std::memset(x.raw(), 0x3c, x.nbytes());
    return x;
  };
  return {
      safetensors_image({{"w", t(DType::kBF16, {3, 5})}, {"b", t(DType::kF32, {5})}}, {{"format", "pt"}}),
      safetensors_image({{"model.layers.0.mlp.experts.0.up_proj.weight", t(DType::kU8, {4, 16})},
                         {"model.layers.0.mlp.experts.0.up_proj.weight_scale", t(DType::kU8, {4, 1})},
                         {"p", t(DType::kFP4E2M1, {2, 32})}}),
      safetensors_image({{"e", t(DType::kFP8E4M3, {128, 128})}, {"s", t(DType::kF32, {1, 1})}}),
  };
}

const char* kTokens[] = {"-1", "18446744073709551615", "9223372036854775807", "1e309", "null", "[]", "{}",
                         "\"F4\"", "\"BF16\"", "0", "\"", "\\u0000", "[0,0]", "[[", "}}", ","};

TEST(SafetensorsFuzz, MutatedHeadersNeverCrash) {
  std::mt19937_64 rng(20261129);
  const auto base = seeds();
  int ok = 0, errors = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string img = base[iter % base.size()];
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      const size_t pos = rng() % img.size();
      switch (rng() % 6) {
        case 0: img[pos] = static_cast<char>(rng()); break;                        // random byte
        case 1: img[pos] ^= static_cast<char>(1u << (rng() % 8)); break;           // bit flip
        case 2: img.resize(rng() % img.size()); break;                             // truncate
        case 3: img.insert(pos, kTokens[rng() % (sizeof(kTokens) / sizeof(*kTokens))]); break;
        case 4: img.append(static_cast<size_t>(rng() % 64), '\0'); break;          // extend
        case 5:                                                                   // header length
          if (img.size() >= 8) img[rng() % 8] = static_cast<char>(rng());
          break;
      }
      if (img.empty()) img = "x";
    }
    auto r = SafetensorsFile::validate_image(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "fuzz");
    if (r.is_ok()) {
      ++ok;
      for (const auto& t : *r) {  // whatever passes must be internally consistent
        ASSERT_LE(t.begin, t.end);
        ASSERT_LE(t.end, img.size());
      }
    } else {
      ++errors;
      ASSERT_FALSE(r.status().message().empty());
    }
  }
  EXPECT_GT(errors, 10000);  // the mutations must actually reach the error paths
  EXPECT_GT(ok, 0);          // and some must survive (e.g. changes inside tensor data)
}

}  // namespace
}  // namespace mxserve::io
