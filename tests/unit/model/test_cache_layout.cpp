// The KV cache layout a model declares (kvcache/kv_cache.h): GQA keys + values, and the MLA latent and DSA
// indexer keys (with FP8 scales) the next architectures need, are expressible and sized from the layout;
// the cache allocates one [n_slots, width] tensor per entry; the backends' kv_copy moves slots in every
// tensor of a layout, in pair order (chained pairs see earlier writes), whatever the widths.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"

namespace mxserve::kvcache {
namespace {

TEST(CacheLayout, GqaIsKeysAndValues) {
  const KvCacheSpec s = KvCacheSpec::gqa(/*layers=*/3, /*blocks=*/10, /*block_size=*/16, /*kv heads=*/2,
                                         /*head_dim=*/32, DType::kF32);
  ASSERT_EQ(s.n_layers(), 3);
  ASSERT_NE(s.layers[2].find(CacheRole::kKey), nullptr);
  ASSERT_NE(s.layers[2].find(CacheRole::kValue), nullptr);
  EXPECT_EQ(s.layers[2].find(CacheRole::kLatent), nullptr);
  EXPECT_EQ(s.bytes(), 2ull * 3 * 160 * 64 * 4);  // K + V, every layer, every slot
  EXPECT_EQ(s.bytes_per_block() * 10, s.bytes());
}

TEST(CacheLayout, GqaFp8IsCodesPlusPerHeadScales) {
  const KvCacheSpec s = KvCacheSpec::gqa_fp8(/*layers=*/2, /*blocks=*/10, /*block_size=*/16, /*kv heads=*/8,
                                             /*head_dim=*/128);
  const CacheTensorSpec* k = s.layers[1].find(CacheRole::kKey);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->dtype, DType::kFP8E4M3);
  EXPECT_EQ(k->scale_width, 8);
  EXPECT_EQ(k->scale_dtype, DType::kF32);
  // Per slot and layer: K and V, 1024 codes + 8 f32 scales each; vs 2048 bytes each in bf16: 1.94x blocks/GiB.
  EXPECT_EQ(s.bytes_per_block(), 2ull * 2 * 16 * (1024 + 32));
  const KvCacheSpec b = KvCacheSpec::gqa(2, 10, 16, 8, 128, DType::kBF16);
  EXPECT_NEAR(static_cast<double>(b.bytes_per_block()) / s.bytes_per_block(), 2048.0 / 1056.0, 1e-12);
  KvCache cache(s, [](DType d, Shape sh) { return Tensor::zeros(d, std::move(sh)); });
  EXPECT_EQ(cache.scales(0, CacheRole::kValue).shape(), (Shape{160, 8}));
  EXPECT_NE(cache.scales_if_any(1, CacheRole::kKey), nullptr);
  EXPECT_EQ(cache.all_tensors().size(), 8u);  // K, V and their scales, two layers
  KvCache plain(b, [](DType d, Shape sh) { return Tensor::zeros(d, std::move(sh)); });
  EXPECT_EQ(plain.scales_if_any(0, CacheRole::kKey), nullptr);
}

TEST(CacheLayout, KvCacheDtypeFlag) {
  EXPECT_EQ(*parse_kv_cache_dtype("auto"), KvCacheDtype::kAuto);
  EXPECT_EQ(*parse_kv_cache_dtype("bf16"), KvCacheDtype::kAuto);
  EXPECT_EQ(*parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::kFp8E4M3);
  EXPECT_EQ(*parse_kv_cache_dtype("fp8"), KvCacheDtype::kFp8E4M3);
  auto bad = parse_kv_cache_dtype("fp8_e5m2");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("--kv-cache-dtype 'fp8_e5m2'"), std::string::npos);
}

TEST(CacheLayout, MlaLatentAndDsaIndexerKeysAreExpressible) {
  KvCacheSpec mla;
  mla.n_blocks = 4;
  mla.block_size = 64;
  // MLA: one latent per token, kv_lora_rank 512 + qk_rope_head_dim 64, no separate V.
  mla.layers.assign(2, CacheLayerSpec{{{CacheRole::kLatent, 512 + 64, DType::kBF16}}});
  EXPECT_EQ(mla.bytes_per_block(), 2ull * 64 * 576 * 2);
  // DSA: the latent plus FP8 indexer keys (index_head_dim 128) with one f32 scale per slot.
  KvCacheSpec dsa = mla;
  for (auto& l : dsa.layers)
    l.tensors.push_back({CacheRole::kIndexerKey, 128, DType::kFP8E4M3, /*scale_width=*/1, DType::kF32});
  EXPECT_EQ(dsa.bytes_per_block(), 2ull * 64 * (576 * 2 + 128 + 4));

  KvCache cache(dsa, [](DType dt, Shape shape) { return Tensor::zeros(dt, std::move(shape)); });
  EXPECT_EQ(cache.tensor(1, CacheRole::kLatent).shape(), (Shape{256, 576}));
  EXPECT_EQ(cache.tensor(1, CacheRole::kIndexerKey).shape(), (Shape{256, 128}));
  EXPECT_EQ(cache.tensor(1, CacheRole::kIndexerKey).dtype(), DType::kFP8E4M3);
  EXPECT_EQ(cache.scales(1, CacheRole::kIndexerKey).shape(), (Shape{256, 1}));
  EXPECT_EQ(cache.all_tensors().size(), 2u * 3);  // per layer: latent, indexer keys, their scales
}

TEST(CacheLayout, CpuKvCopyMovesEveryTensorInPairOrder) {
  // Three tensors of two widths (K, V, and a latent of another width: it is copied on its own).
  KvCacheSpec s;
  s.n_blocks = 4;
  s.block_size = 4;
  s.layers.assign(1, CacheLayerSpec{{{CacheRole::kKey, 8, DType::kF32},
                                     {CacheRole::kValue, 8, DType::kF32},
                                     {CacheRole::kLatent, 5, DType::kF32}}});
  auto be = backend::make_cpu_backend();
  KvCache cache(s, [&](DType dt, Shape shape) { return be->alloc(dt, std::move(shape)); });
  std::vector<Tensor*> all = cache.all_tensors();
  ASSERT_EQ(all.size(), 3u);
  for (size_t t = 0; t < all.size(); ++t)
    for (int64_t i = 0; i < all[t]->numel(); ++i) all[t]->data<float>()[i] = static_cast<float>(1000 * t + i);
  const int64_t w[3] = {8, 8, 5};
  // Chained: slot 3 is written by pair 0 and read by pair 1.
  std::vector<int32_t> src = {9, 3, 14}, dst = {3, 7, 0};
  Tensor hs = Tensor::view_of(src.data(), DType::kI32, {3}), hd = Tensor::view_of(dst.data(), DType::kI32, {3});
  be->kv_copy(be->upload(hs), be->upload(hd), all);
  for (size_t t = 0; t < all.size(); ++t) {
    auto at = [&](int64_t slot, int64_t c) { return all[t]->data<float>()[slot * w[t] + c]; };
    auto orig = [&](int64_t slot, int64_t c) { return static_cast<float>(1000 * t + slot * w[t] + c); };
    for (int64_t c = 0; c < w[t]; ++c) {
      EXPECT_EQ(at(3, c), orig(9, c)) << "tensor " << t;
      EXPECT_EQ(at(7, c), orig(9, c)) << "tensor " << t << ": pair 1 reads what pair 0 wrote";
      EXPECT_EQ(at(0, c), orig(14, c)) << "tensor " << t;
      EXPECT_EQ(at(9, c), orig(9, c)) << "tensor " << t;
    }
  }
}

}  // namespace
}  // namespace mxserve::kvcache
