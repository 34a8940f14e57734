// The FP8 latent cache of glm_moe_dsa on the CPU reference (--kv-cache-dtype fp8_e4m3, kernels/mla_fp8.h):
// the packed row layout (GLM-5.x: 656-byte latent rows, 132-byte indexer keys), the written bytes checked
// against the format's definition (codes decode within half a mantissa unit of x / s, s = amax / 448 per
// 128-value block, the rope tail is bf16 RNE), the readers (MLA attention, indexer) reading exactly the
// dequantized bytes, kv_copy moving packed rows, a host emulation of the CUDA readers' chunk map, the
// engine's prefix cache and preemption unchanged on an FP8 cache, and shapes the
// layout cannot hold refused with an error naming the flag. Quality against the format's envelope is
// test_kv_fp8_quality (every fixture); the host KV tier on an FP8 latent cache is test_kv_host_tier.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/mla_dsa_ops.h"
#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/mla_fp8.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "runtime/engine.h"
#include "runtime/executor.h"
#include "runtime/sequence_runner.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures";

std::unique_ptr<model::CausalLM> load(backend::Backend& be, const fs::path& dir, kvcache::KvCacheDtype dt,
                                      bool mtp = true) {
  model::LoadOptions lo;
  lo.kv_cache_dtype = dt;
  lo.load_mtp = mtp;
  auto m = model::load_causal_lm(dir.string(), be, lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(*m) : nullptr;
}

TEST(MlaFp8Layout, RowBytes) {
  EXPECT_EQ(kernels::mla_fp8_row_bytes(512, 64), 656);  // FlashMLA / vLLM fp8_ds_mla
  EXPECT_EQ(kernels::mla_fp8_tail_offset(512), 528);
  EXPECT_EQ(kernels::mla_fp8_row_bytes(128, 0), 132);  // DeepGEMM fp8_paged_mqa_logits: 128 e4m3 + f32
  EXPECT_EQ(kernels::mla_fp8_row_bytes(160, 8), 160 + 8 + 16);  // a partial last block still has its scale
  EXPECT_FALSE(kernels::mla_fp8_shape_ok(30, 8));
  EXPECT_FALSE(kernels::mla_fp8_shape_ok(32, 7));
}

TEST(MlaFp8Layout, KvSpecOfTheFixture) {
  auto be = backend::make_cpu_backend();
  auto lm = load(*be, kFixtures / "glm_moe_dsa_tiny_a", kvcache::KvCacheDtype::kFp8E4M3);
  ASSERT_TRUE(lm);
  EXPECT_EQ(lm->kv_cache_dtype(), kvcache::KvCacheDtype::kFp8E4M3);
  const kvcache::KvCacheSpec s = lm->kv_spec(3, 16);
  ASSERT_EQ(s.n_layers(), 5);  // 4 layers + MTP; indexer_types full, shared, full, shared
  const auto* lat = s.layers[0].find(kvcache::CacheRole::kLatent);
  const auto* idx = s.layers[0].find(kvcache::CacheRole::kIndexerKey);
  ASSERT_TRUE(lat && idx);
  EXPECT_EQ(lat->dtype, DType::kU8);
  EXPECT_EQ(lat->width, 32 + 4 + 2 * 8);  // kv_lora_rank 32, one scale, qk_rope 8 bf16
  EXPECT_EQ(idx->dtype, DType::kU8);
  EXPECT_EQ(idx->width, 16 + 4);  // index_head_dim 16, one scale
  EXPECT_EQ(s.layers[1].find(kvcache::CacheRole::kIndexerKey), nullptr);
  EXPECT_NE(s.layers[4].find(kvcache::CacheRole::kIndexerKey), nullptr);
  EXPECT_EQ(s.bytes_per_block(), 16u * (5 * 52 + 3 * 20));
}

// Rows with a wide range per block (outliers, tiny values, exact zeros) through the backend's cache_write.
TEST(MlaFp8Bytes, WriteMatchesTheFormatDefinition) {
  auto be = backend::make_cpu_backend();
  backend::MlaDsaOps* ops = backend::mla_dsa_ops(*be);
  ASSERT_NE(ops, nullptr);
  const int64_t N = 160, R = 8, T = 5, n_slots = 8, row_bytes = kernels::mla_fp8_row_bytes(N, R);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  Tensor lat = Tensor::empty(DType::kF32, {T, N}), rope = Tensor::empty(DType::kF32, {T, R});
  for (int64_t i = 0; i < T * N; ++i) lat.data<float>()[i] = nd(rng) * std::exp2(static_cast<float>(i % 13) - 8.f);
  for (int64_t i = 0; i < T * R; ++i) rope.data<float>()[i] = nd(rng) * 30.f;
  lat.data<float>()[3] = 0.f;
  lat.data<float>()[N + 7] = -250.f;  // an outlier in row 1's first block
  for (int64_t c = 128; c < N; ++c) lat.data<float>()[2 * N + c] = 0.f;  // row 2's second block all zero
  Tensor cache = Tensor::empty(DType::kU8, {n_slots, row_bytes});
  std::memset(cache.raw(), 0xAB, static_cast<size_t>(cache.nbytes()));
  backend::AttentionMeta meta;
  std::vector<int32_t> slots = {6, 1, 3, -1, 0};  // row 3 is padding: not written
  meta.slot_mapping = Tensor::view_of(slots.data(), DType::kI32, {T});
  ops->cache_write(lat, meta, cache, 0);
  ops->cache_write(rope, meta, cache, N);
  const uint8_t* c8 = static_cast<const uint8_t*>(cache.raw());
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    const uint8_t* row = c8 + slots[t] * row_bytes;
    const float* x = lat.data<float>() + t * N;
    for (int64_t blk = 0; blk < 2; ++blk) {
      const int64_t b0 = blk * 128, e = std::min<int64_t>(N, b0 + 128);
      float amax = 0.f, s = 0.f;
      for (int64_t c = b0; c < e; ++c) amax = std::max(amax, std::fabs(x[c]));
      std::memcpy(&s, row + N + 4 * blk, 4);
      EXPECT_EQ(s, amax / 448.f) << "row " << t << " block " << blk;
      for (int64_t c = b0; c < e; ++c) {
        const float got = fp8_e4m3_to_f32(row[c]) * s;
        // half a unit of e4m3's 3-bit mantissa of x / s (normal), 2^-10 s below 2^-6 (subnormal)
        const float y = std::fabs(x[c]) / (s > 0 ? s : 1.f);
        const float tol = s == 0.f ? 0.f : y < std::exp2(-6.f) ? std::exp2(-10.f) * s
                                                                : std::exp2(std::floor(std::log2(y)) - 4.f) * s;
        EXPECT_LE(std::fabs(got - x[c]), tol * 1.0001f) << "row " << t << " value " << c << " = " << x[c];
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      uint16_t b;
      std::memcpy(&b, row + kernels::mla_fp8_tail_offset(N) + 2 * r, 2);
      EXPECT_EQ(b, f32_to_bf16(rope.data<float>()[t * R + r])) << "row " << t << " rope " << r;
    }
  }
  // Slots no row maps to (and the padding row's) are untouched.
  for (int64_t slot : {2, 4, 5, 7})
    for (int64_t b = 0; b < row_bytes; ++b) ASSERT_EQ(c8[slot * row_bytes + b], 0xAB) << "slot " << slot;
  // dequant_fp8_packed_row reads back the same values
  std::vector<float> back(N + R);
  kernels::cpu::dequant_fp8_packed_row(c8 + 6 * row_bytes, N, R, back.data());
  float s0;
  std::memcpy(&s0, c8 + 6 * row_bytes + N, 4);
  EXPECT_EQ(back[0], fp8_e4m3_to_f32(c8[6 * row_bytes]) * s0);
  EXPECT_EQ(back[N + 1], bf16_to_f32(f32_to_bf16(rope.data<float>()[1])));
}

// The readers see exactly the stored bytes: attention / indexer over an FP8 cache equal the f32 kernels over
// a cache holding the dequantized rows (the same arithmetic, bit for bit).
TEST(MlaFp8Bytes, ReadersUseTheDequantizedRows) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t NH = 2, NOPE = 6, ROPE = 4, V = 5, L = 8, CTX = 11, T = 3, bs = 2, n_blocks = 6;
  const int64_t n_slots = n_blocks * bs, row_bytes = kernels::mla_fp8_row_bytes(L, ROPE);
  std::vector<int32_t> table = {3, 0, 5, 1, 4, 2}, token_seq(T, 0), kv_index;
  for (int64_t t = 0; t < T; ++t) kv_index.push_back(static_cast<int32_t>(CTX - T + t));
  kernels::AttentionParams ap;
  ap.n_tokens = static_cast<int32_t>(T);
  ap.n_seqs = 1;
  ap.block_size = static_cast<int32_t>(bs);
  ap.max_blocks_per_seq = static_cast<int32_t>(n_blocks);
  std::vector<float> rows(n_slots * (L + ROPE)), lat(n_slots * L), rope(n_slots * ROPE);
  for (float& v : rows) v = nd(rng);
  std::vector<int32_t> all_slots(n_slots);
  for (int64_t i = 0; i < n_slots; ++i) all_slots[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < n_slots; ++i) {
    std::copy_n(&rows[i * (L + ROPE)], L, &lat[i * L]);
    std::copy_n(&rows[i * (L + ROPE) + L], ROPE, &rope[i * ROPE]);
  }
  std::vector<uint8_t> packed(n_slots * row_bytes);
  kernels::cpu::cache_write_fp8_packed(lat.data(), all_slots.data(), packed.data(), n_slots, L, row_bytes, 0);
  kernels::cpu::cache_write_fp8_packed(rope.data(), all_slots.data(), packed.data(), n_slots, ROPE, row_bytes, L);
  std::vector<float> deq(n_slots * (L + ROPE));
  for (int64_t i = 0; i < n_slots; ++i)
    kernels::cpu::dequant_fp8_packed_row(&packed[i * row_bytes], L, ROPE, &deq[i * (L + ROPE)]);
  std::vector<float> q(T * NH * (NOPE + ROPE)), kvb(NH * (NOPE + V) * L);
  for (float& v : q) v = nd(rng);
  for (float& v : kvb) v = 0.5f * nd(rng);
  std::vector<int32_t> topk = {0, 2, 5, 6, /**/ 1, 7, -1, -1, /**/ 0, 3, 4, 8};
  kernels::MlaParams p{static_cast<int32_t>(NH), static_cast<int32_t>(NOPE), static_cast<int32_t>(ROPE),
                       static_cast<int32_t>(V), static_cast<int32_t>(L), 0.3f};
  for (const int32_t* tk : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(topk.data())}) {
    std::vector<float> want(T * NH * V), got(T * NH * V);
    kernels::cpu::mla_attention_f32(q.data(), deq.data(), kvb.data(), tk, 4, token_seq.data(), kv_index.data(),
                                    table.data(), want.data(), p, ap);
    kernels::MlaParams pf = p;
    pf.fp8_cache = true;
    kernels::cpu::mla_attention_f32(q.data(), packed.data(), kvb.data(), tk, 4, token_seq.data(), kv_index.data(),
                                    table.data(), got.data(), pf, ap);
    EXPECT_EQ(got, want) << (tk ? "sparse" : "dense");
    std::vector<float> exact(T * NH * V);  // and the FP8 cache does change the result
    kernels::cpu::mla_attention_f32(q.data(), rows.data(), kvb.data(), tk, 4, token_seq.data(), kv_index.data(),
                                    table.data(), exact.data(), p, ap);
    EXPECT_NE(got, exact);
  }
  // Indexer keys: D = 8 values per row, 2 heads, top 3.
  const int64_t D = 8, key_bytes = kernels::mla_fp8_row_bytes(D, 0);
  std::vector<float> keys(n_slots * D), qi(T * NH * D), w(T * NH);
  for (float& v : keys) v = nd(rng);
  for (float& v : qi) v = nd(rng);
  for (float& v : w) v = nd(rng);
  std::vector<uint8_t> kp(n_slots * key_bytes);
  kernels::cpu::cache_write_fp8_packed(keys.data(), all_slots.data(), kp.data(), n_slots, D, key_bytes, 0);
  std::vector<float> kdeq(n_slots * D);
  for (int64_t i = 0; i < n_slots; ++i) kernels::cpu::dequant_fp8_packed_row(&kp[i * key_bytes], D, 0, &kdeq[i * D]);
  kernels::IndexerParams ip{static_cast<int32_t>(NH), static_cast<int32_t>(D), 3, 0.3f, 0.7f};
  std::vector<int32_t> want(T * 3), got(T * 3);
  kernels::cpu::indexer_topk_f32(qi.data(), w.data(), kdeq.data(), token_seq.data(), kv_index.data(), table.data(),
                                 want.data(), ip, ap);
  ip.fp8_keys = true;
  kernels::cpu::indexer_topk_f32(qi.data(), w.data(), kp.data(), token_seq.data(), kv_index.data(), table.data(),
                                 got.data(), ip, ap);
  EXPECT_EQ(got, want);
}

// Tree compaction (Backend::kv_copy over every tensor of the layout) moves whole packed rows of both widths
// (52-byte latent, 20-byte indexer key on this fixture), the MTP layer's included.
TEST(MlaFp8Layout, KvCopyMovesPackedRows) {
  auto be = backend::make_cpu_backend();
  auto lm = load(*be, kFixtures / "glm_moe_dsa_tiny_a", kvcache::KvCacheDtype::kFp8E4M3);
  ASSERT_TRUE(lm);
  kvcache::KvCache cache(lm->kv_spec(2, 4), [&](DType dt, Shape shape) { return be->alloc(dt, std::move(shape)); });
  std::vector<Tensor*> all = cache.all_tensors();
  ASSERT_EQ(all.size(), 8u);  // 5 latent + 3 indexer-key tensors
  std::vector<Tensor> before;
  for (size_t t = 0; t < all.size(); ++t) {
    ASSERT_EQ(all[t]->dtype(), DType::kU8);
    for (int64_t i = 0; i < all[t]->numel(); ++i) all[t]->data<uint8_t>()[i] = static_cast<uint8_t>(7 * t + 13 * i);
    Tensor copy = Tensor::empty(DType::kU8, all[t]->shape());
    std::memcpy(copy.raw(), all[t]->raw(), static_cast<size_t>(all[t]->nbytes()));
    before.push_back(copy);
  }
  std::vector<int32_t> src = {5, 2}, dst = {2, 6};  // chained: slot 2 written by pair 0, read by pair 1
  be->kv_copy(be->upload(Tensor::view_of(src.data(), DType::kI32, {2})),
              be->upload(Tensor::view_of(dst.data(), DType::kI32, {2})), all);
  for (size_t t = 0; t < all.size(); ++t) {
    const int64_t w = all[t]->dim(1);
    const uint8_t* a = all[t]->data<uint8_t>();
    const uint8_t* b = before[t].data<uint8_t>();
    EXPECT_EQ(std::memcmp(a + 2 * w, b + 5 * w, w), 0) << "tensor " << t;
    EXPECT_EQ(std::memcmp(a + 6 * w, b + 5 * w, w), 0) << "tensor " << t;
    EXPECT_EQ(std::memcmp(a + 5 * w, b + 5 * w, w), 0) << "tensor " << t << ": the source row is untouched";
    EXPECT_EQ(std::memcmp(a, b, w), 0) << "tensor " << t;
  }
}

// Host emulation of the CUDA readers' index math (kernels/mla_fp8.h mla_fp8_chunk, used by
// mla_fp8_load.cuh; the GPU itself is test_cuda_mla_fp8): every 16-byte output chunk of the tensor-core paths,
// decoded from the bytes the chunk map names, reproduces the CPU's dequantized row; the tensor-core attend's
// staging copy (41 16-byte pieces of a 656-byte row) covers the row exactly; the alignments the device loads
// assume hold (codes 8 bytes / 4 bytes for 132-byte indexer rows, scales 4, the rope tail 16 at 512 / 64).
TEST(MlaFp8DeviceMath, ChunkMapReproducesTheRow) {
  struct Case {
    int64_t n, tail;
  };
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const Case c : {Case{512, 64}, Case{128, 0}, Case{32, 8}, Case{24, 16}, Case{16, 0}, Case{160, 8}}) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << " tail " << c.tail);
    const int64_t rb = kernels::mla_fp8_row_bytes(c.n, c.tail), slots = 3;
    std::vector<float> lat(slots * c.n), rope(slots * std::max<int64_t>(c.tail, 1));
    for (float& v : lat) v = nd(rng) * 3.f;
    for (float& v : rope) v = nd(rng);
    std::vector<int32_t> all = {0, 1, 2};
    std::vector<uint8_t> packed(slots * rb);
    kernels::cpu::cache_write_fp8_packed(lat.data(), all.data(), packed.data(), slots, c.n, rb, 0);
    if (c.tail > 0) kernels::cpu::cache_write_fp8_packed(rope.data(), all.data(), packed.data(), slots, c.tail, rb, c.n);
    for (int64_t s = 0; s < slots; ++s) {
      const uint8_t* row = &packed[s * rb];
      std::vector<float> want(c.n + c.tail), got(c.n + c.tail, NAN);
      kernels::cpu::dequant_fp8_packed_row(row, c.n, c.tail, want.data());
      for (int64_t ch = 0; ch < (c.n + c.tail) / 8; ++ch) {
        const kernels::MlaFp8Chunk k = kernels::mla_fp8_chunk(c.n, ch);
        if (k.scale >= 0) {
          ASSERT_EQ(k.bytes % (rb % 8 == 0 ? 8 : 4), 0);
          ASSERT_EQ(k.scale % 4, 0);
          float scale;
          std::memcpy(&scale, row + k.scale, 4);
          for (int i = 0; i < 8; ++i) got[8 * ch + i] = fp8_e4m3_to_f32(row[k.bytes + i]) * scale;
        } else {
          if (c.n == 512 && c.tail == 64) ASSERT_EQ(k.bytes % 16, 0);  // the tensor-core path's uint4 tail load
          for (int i = 0; i < 8; ++i) {
            uint16_t b;
            std::memcpy(&b, row + k.bytes + 2 * i, 2);
            got[8 * ch + i] = bf16_to_f32(b);
          }
        }
      }
      EXPECT_EQ(got, want) << "slot " << s;
    }
  }
  // The staging copy of the tensor-core attend: 41 pieces of 16 bytes = one 656-byte row, 16-byte aligned rows.
  EXPECT_EQ(41 * 16, kernels::mla_fp8_row_bytes(512, 64));
  EXPECT_EQ(kernels::mla_fp8_row_bytes(128, 0) % 4, 0);
}

// The engine on an FP8 cache: chunked prefill, prefix reuse and preemption give the greedy tokens of one
// uncached pass per request (the quantization is per token row, so every path stores the same bytes).
std::vector<std::vector<int32_t>> engine_greedy(model::CausalLM& lm, backend::Backend& be,
                                                const std::vector<runtime::RequestSpec>& specs, int64_t n_blocks,
                                                int64_t* hits, int64_t* preemptions) {
  runtime::EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 32;
  cfg.scheduler.chunked_prefill_size = 5;
  cfg.scheduler.enable_prefix_cache = true;
  cfg.n_blocks = n_blocks;
  cfg.max_model_len = 256;
  runtime::Engine engine(cfg, runtime::make_model_executor(lm, be, n_blocks, 4));
  std::map<runtime::RequestId, std::vector<int32_t>> tokens;
  std::vector<runtime::RequestId> order;
  *hits = 0;
  for (const auto& s : specs) {
    auto id = engine.submit(s, [&](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) tokens[ev.id].push_back(ev.token);
      if (ev.finish != runtime::FinishReason::kNone) *hits += ev.usage.cached_tokens;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    order.push_back(*id);
  }
  while (!engine.idle()) {
    engine.step();
    EXPECT_TRUE(engine.check_invariants().is_ok());
  }
  *preemptions = engine.stats().scheduler.preemptions;
  std::vector<std::vector<int32_t>> out;
  for (auto id : order) out.push_back(tokens[id]);
  return out;
}

TEST(MlaFp8Engine, PrefixReuseAndPreemptionMatchOnePass) {
  auto be = backend::make_cpu_backend();
  auto lm = load(*be, kFixtures / "glm_moe_dsa_tiny_a", kvcache::KvCacheDtype::kFp8E4M3, /*mtp=*/false);
  ASSERT_TRUE(lm);
  const std::vector<int32_t> prompt = {3, 17, 42, 8, 8, 91, 5, 60, 33, 2, 77, 14, 29, 50, 11, 64, 7, 38, 21, 90};
  std::vector<runtime::RequestSpec> specs;
  for (int i = 0; i < 4; ++i) {
    runtime::RequestSpec s;
    s.prompt.assign(prompt.begin(), prompt.begin() + 10 + 2 * i);  // a shared prefix, longer than top-k (6)
    s.prompt.push_back(static_cast<int32_t>(40 + i));
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 6;
    s.sampling.ignore_eos = true;
    specs.push_back(s);
  }
  runtime::SequenceRunner runner(*lm, *be, 64, 4);
  int64_t hits = 0, preemptions = 0;
  const auto cached = engine_greedy(*lm, *be, specs, 256, &hits, &preemptions);
  EXPECT_GT(hits, 0) << "the shared prefix must be served from the cache";
  const auto tight = engine_greedy(*lm, *be, specs, 7, &hits, &preemptions);  // 28 slots for 4 requests
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto ref = runner.greedy(specs[i].prompt, 6, 1000, {});
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    EXPECT_EQ(cached[i], *ref) << "request " << i;
    EXPECT_EQ(tight[i], *ref) << "request " << i << " (preempted run)";
  }
}

// A glm_moe_dsa shape the packed rows cannot hold: refused at load, naming the flag and the field.
TEST(MlaFp8BadInput, UnpackableShapeNamesTheFlag) {
  const fs::path dir = fs::temp_directory_path() / ("mxserve_mla_fp8_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kFixtures / "glm_moe_dsa_tiny_a" / "config.json"));
  j["kv_lora_rank"] = 30;
  std::ofstream(dir / "config.json") << j.dump(2);
  auto be = backend::make_cpu_backend();
  model::LoadOptions lo;
  lo.synthetic = true;
  lo.kv_cache_dtype = kvcache::KvCacheDtype::kFp8E4M3;
  auto m = model::load_causal_lm(dir.string(), *be, lo);
  ASSERT_FALSE(m.is_ok());
  const std::string err = m.status().to_string();
  EXPECT_NE(err.find("--kv-cache-dtype fp8_e4m3"), std::string::npos) << err;
  EXPECT_NE(err.find("kv_lora_rank"), std::string::npos) << err;
  lo.kv_cache_dtype = kvcache::KvCacheDtype::kAuto;  // the same model loads with the default cache
  auto ok = model::load_causal_lm(dir.string(), *be, lo);
  EXPECT_TRUE(ok.is_ok()) << ok.status().to_string();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mxserve
