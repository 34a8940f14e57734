// Rank-sliced loading (issue 32 item 3, model/layers/weight_loader.h): on the CPU backend at tp 2 / 4 and
// ep 2, a checkpoint written here (row-, column-sharded and replicated weights plus a transformers 5.x fused
// expert stack) loads per rank as (a) exactly the rank's slices of the full tensors, bit for bit, (b) with
// the loader's byte accounting at the rank's share (bytes read == share for float weights; the sum over the
// ranks == the checkpoint's bytes plus the replicated weights' extra copies), and binding a fused expert
// stack copies nothing (each expert's weight is a view into the mapped file). Quantized weights (MXFP4, FP8
// block) slice packed, bit for bit; the committed fixtures load rank by rank reading their shares.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/layers/weight_loader.h"
#include "model/registry.h"
#include "model/weight_table.h"
#include "quant/weight_format.h"

namespace mxserve::model {
namespace {

namespace fs = std::filesystem;
using parallel::ShardAxis;

constexpr int64_t kH = 6, kQ = 8, kI = 4, kE = 4;

Tensor random_f32(Shape shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

// Rows [r0, r1) x cols [c0, c1) of matrix m of a row-major [M, R, C] (or [R, C] with M = 1) f32 tensor.
std::vector<float> window(const Tensor& t, int64_t m, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t R = t.dim(t.ndim() - 2), C = t.dim(t.ndim() - 1);
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(t.data<float>()[(m * R + r) * C + c]);
  return out;
}

std::vector<float> host_values(backend::Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  EXPECT_EQ(h.dtype(), DType::kF32);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class RankSlicedLoading : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mxserve_rank_sliced_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::mt19937 rng(7);
    q_ = random_f32({kQ, kH}, rng);         // kRow
    o_ = random_f32({kH, kQ}, rng);         // kColumn
    norm_ = random_f32({kH}, rng);          // replicated
    gate_up_ = random_f32({kE, 2 * kI, kH}, rng);  // fused: gate rows [0, I), up rows [I, 2I)
    down_ = random_f32({kE, kH, kI}, rng);
    ASSERT_TRUE(io::write_safetensors((dir_ / "model.safetensors").string(),
                                      {{"l.q.weight", q_},
                                       {"l.o.weight", o_},
                                       {"l.norm.weight", norm_},
                                       {"l.mlp.experts.gate_up_proj", gate_up_},
                                       {"l.mlp.experts.down_proj", down_}})
                    .is_ok());
    auto spec = [](std::string n, Shape s, ShardAxis a) {
      WeightSpec w;
      w.name = std::move(n), w.shape = std::move(s), w.shard = a;
      w.allowed = {Precision::kF32, Precision::kBF16};
      return w;
    };
    q_spec_ = spec("l.q.weight", {kQ, kH}, ShardAxis::kRow);
    o_spec_ = spec("l.o.weight", {kH, kQ}, ShardAxis::kColumn);
    norm_spec_ = spec("l.norm.weight", {kH}, ShardAxis::kNone);
    table_ = {q_spec_, o_spec_, norm_spec_};
    for (int64_t e = 0; e < kE; ++e) {
      const std::string p = "l.mlp.experts." + std::to_string(e) + ".";
      std::vector<WeightSpec> gu;
      for (const char* proj : {"gate_proj", "up_proj"}) {
        WeightSpec w = spec(p + proj + ".weight", {kI, kH}, ShardAxis::kExpert);
        w.expert = e, w.n_experts = kE, w.expert_tp = ShardAxis::kRow;
        gu.push_back(w);
        table_.push_back(w);
      }
      WeightSpec d = spec(p + "down_proj.weight", {kH, kI}, ShardAxis::kExpert);
      d.expert = e, d.n_experts = kE, d.expert_tp = ShardAxis::kColumn;
      table_.push_back(d);
      decls_.gate_up.push_back(gu);
      decls_.down.push_back(d);
    }
    auto ckpt = io::Checkpoint::open(dir_.string());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
    ckpt_ = std::move(ckpt).value();
    auto bound = bind_weights(*ckpt_, table_, {});
    ASSERT_TRUE(bound.is_ok()) << bound.status().message();
    bound_ = std::move(bound).value();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads every weight for `rank`, checks each against the slice of the full tensor, returns the stats.
  WeightLoader::LoadStats load_and_check(const parallel::RankLayout& rank) {
    auto be = backend::make_cpu_backend();
    WeightLoader wl(*be, bound_);
    wl.set_rank(rank, nullptr);
    const int64_t tp = rank.tp, t = rank.tp_rank();
    const std::string where = rank.describe();
    EXPECT_TRUE(bit_equal(host_values(*be, wl.get(q_spec_)), window(q_, 0, t * kQ / tp, (t + 1) * kQ / tp, 0, kH)))
        << where;
    EXPECT_TRUE(bit_equal(host_values(*be, wl.get(o_spec_)), window(o_, 0, 0, kH, t * kQ / tp, (t + 1) * kQ / tp)))
        << where;
    EXPECT_TRUE(bit_equal(host_values(*be, wl.get(norm_spec_)), window(norm_.reshape({1, kH}), 0, 0, 1, 0, kH)))
        << where;
    const backend::ExpertWeights ex = wl.experts(decls_);
    const std::vector<float> gu = host_values(*be, ex.gate_up), dn = host_values(*be, ex.down);
    std::vector<float> want_gu, want_dn;
    if (rank.ep > 1) {  // the rank's experts, whole
      const int64_t per = kE / rank.ep, e0 = rank.ep_rank() * per;
      for (int64_t e = e0; e < e0 + per; ++e) {
        for (float v : window(gate_up_, e, 0, 2 * kI, 0, kH)) want_gu.push_back(v);
        for (float v : window(down_, e, 0, kH, 0, kI)) want_dn.push_back(v);
      }
    } else {  // every expert, its tp slice: gate rows then up rows, down columns
      const int64_t w = kI / tp;
      for (int64_t e = 0; e < kE; ++e) {
        for (float v : window(gate_up_, e, t * w, (t + 1) * w, 0, kH)) want_gu.push_back(v);
        for (float v : window(gate_up_, e, kI + t * w, kI + (t + 1) * w, 0, kH)) want_gu.push_back(v);
        for (float v : window(down_, e, 0, kH, t * w, (t + 1) * w)) want_dn.push_back(v);
      }
    }
    EXPECT_TRUE(bit_equal(gu, want_gu)) << where << ": gate_up";
    EXPECT_TRUE(bit_equal(dn, want_dn)) << where << ": down";
    return wl.stats();
  }

  void check_layout(int tp, int ep) {
    const uint64_t replicated = norm_.nbytes();
    uint64_t sum_read = 0;
    for (int r = 0; r < tp; ++r) {
      parallel::RankLayout rank;
      rank.tp = tp, rank.ep = ep, rank.rank = r;
      const WeightLoader::LoadStats st = load_and_check(rank);
      // Float weights: a rank reads exactly its share, and its share is 1/tp of the sharded bytes.
      EXPECT_EQ(st.bytes_read, st.bytes_share) << "tp " << tp << " ep " << ep << " rank " << r;
      EXPECT_EQ(st.bytes_share, (ckpt_->tensor_bytes() - replicated) / tp + replicated) << "rank " << r;
      EXPECT_EQ(st.backend_bytes, st.bytes_share) << "rank " << r;  // f32 stored, f32 on the CPU backend
      sum_read += st.bytes_read;
    }
    EXPECT_EQ(sum_read, ckpt_->tensor_bytes() + (tp - 1) * replicated) << "tp " << tp << " ep " << ep;
  }

  fs::path dir_;
  Tensor q_, o_, norm_, gate_up_, down_;
  WeightSpec q_spec_, o_spec_, norm_spec_;
  std::vector<WeightSpec> table_;
  WeightLoader::ExpertDecls decls_;
  std::unique_ptr<io::Checkpoint> ckpt_;
  BoundWeights bound_;
};

TEST_F(RankSlicedLoading, BindingAFusedExpertStackCopiesNothing) {
  const io::CheckpointTensor* fused = ckpt_->find("l.mlp.experts.gate_up_proj");
  ASSERT_NE(fused, nullptr);
  const char* base = static_cast<const char*>(ckpt_->view(*fused).raw());
  const uint64_t row = kH * sizeof(float);
  // expert 2's up rows start at (2 * 2I + I) rows into the stack: a view of the mapping, not a copy
  EXPECT_EQ(static_cast<const char*>(bound_.at("l.mlp.experts.2.up_proj.weight").stored.data.raw()),
            base + (2 * 2 * kI + kI) * row);
  EXPECT_EQ(static_cast<const char*>(bound_.at("l.mlp.experts.1.gate_proj.weight").stored.data.raw()),
            base + (1 * 2 * kI) * row);
}

TEST_F(RankSlicedLoading, OneRankReadsTheWholeCheckpoint) { check_layout(1, 1); }
TEST_F(RankSlicedLoading, Tp2RanksReadTheirSlices) { check_layout(2, 1); }
TEST_F(RankSlicedLoading, Tp4RanksReadTheirSlices) { check_layout(4, 1); }

TEST_F(RankSlicedLoading, Ep2RanksReadTheirExperts) {
  // tp 2 with ep 2: q / o sliced by tp, each rank its two experts whole.
  const uint64_t replicated = norm_.nbytes();
  const uint64_t dense = q_.nbytes() + o_.nbytes(), experts = gate_up_.nbytes() + down_.nbytes();
  uint64_t sum_read = 0;
  for (int r = 0; r < 2; ++r) {
    parallel::RankLayout rank;
    rank.tp = 2, rank.ep = 2, rank.rank = r;
    const WeightLoader::LoadStats st = load_and_check(rank);
    EXPECT_EQ(st.bytes_read, st.bytes_share);
    EXPECT_EQ(st.bytes_read, dense / 2 + experts / 2 + replicated) << "rank " << r;
    sum_read += st.bytes_read;
  }
  EXPECT_EQ(sum_read, ckpt_->tensor_bytes() + replicated);
}

// Quantized weights are sliced packed (data rows / columns and their scale blocks, then dequantized): bit for
// bit the slice of the whole dequantized tensor, reading only the share; a slice that splits a scale block
// falls back to the whole tensor (and counts it).
Tensor random_u8(Shape shape, std::mt19937& rng, int lo, int span, uint8_t mask = 0xFF, DType dt = DType::kU8) {
  Tensor t = Tensor::empty(dt, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>((lo + rng() % span) & mask);
  return t;
}

TEST(RankSlicedQuantized, PackedSlicesDequantizeToTheSliceOfTheWhole) {
  std::mt19937 rng(5);
  BoundWeights bound;
  quant::StoredWeight mx;  // mxfp4 [8, 64]: codes u8 [8, 32], E8M0 scales [8, 2]
  mx.precision = Precision::kMxfp4, mx.name = "mx.weight", mx.scale_name = "mx.weight_scale", mx.shape = {8, 64};
  mx.data = random_u8({8, 32}, rng, 0, 256), mx.scale = random_u8({8, 2}, rng, 120, 10);
  quant::StoredWeight fp;  // fp8-block [8, 16] in 4x4 blocks: scale f32 [2, 4]
  fp.precision = Precision::kFp8Block, fp.name = "fp.weight", fp.scale_name = "fp.weight_scale_inv";
  fp.shape = {8, 16}, fp.block_rows = 4, fp.block_cols = 4;
  fp.data = random_u8({8, 16}, rng, 0, 256, 0x7E, DType::kFP8E4M3);  // no NaN codes
  fp.scale = random_f32({2, 4}, rng);
  const Tensor mx_whole = quant::to_host_f32(mx), fp_whole = quant::to_host_f32(fp);
  const uint64_t mx_bytes = mx.data.nbytes() + mx.scale.nbytes(), fp_bytes = fp.data.nbytes() + fp.scale.nbytes();
  bound.add("mx.weight", BoundWeight(mx));
  bound.add("fp.weight", BoundWeight(fp));
  auto spec = [](std::string n, Shape s, ShardAxis a, Precision p) {
    WeightSpec w;
    w.name = std::move(n), w.shape = std::move(s), w.shard = a, w.allowed = {p};
    return w;
  };
  for (ShardAxis axis : {ShardAxis::kRow, ShardAxis::kColumn}) {
    for (int tp : {2, 4}) {
      for (int r = 0; r < tp; ++r) {
        parallel::RankLayout rank;
        rank.tp = tp, rank.rank = r;
        auto be = backend::make_cpu_backend();
        WeightLoader wl(*be, bound);
        wl.set_rank(rank, nullptr);
        const std::string where = std::string(parallel::shard_axis_name(axis)) + " tp " + std::to_string(tp) +
                                  " rank " + std::to_string(r);
        const bool rows = axis == ShardAxis::kRow;
        // mxfp4: rows always split whole; columns only on 32-element blocks (tp 2 of 64: yes, tp 4: no)
        const std::vector<float> mx_got = host_values(*be, wl.get(spec("mx.weight", {8, 64}, axis, Precision::kMxfp4)));
        const std::vector<float> mx_want = rows ? window(mx_whole, 0, r * 8 / tp, (r + 1) * 8 / tp, 0, 64)
                                                : window(mx_whole, 0, 0, 8, r * 64 / tp, (r + 1) * 64 / tp);
        EXPECT_TRUE(bit_equal(mx_got, mx_want)) << where;
        const bool mx_packed = rows || (64 / tp) % 32 == 0;
        EXPECT_EQ(wl.stats().bytes_read, mx_packed ? mx_bytes / tp : mx_bytes) << where;
        EXPECT_EQ(wl.stats().bytes_share, mx_bytes / tp) << where;
        // fp8-block, 4x4 blocks: tp 2 of 8 rows and tp 2 / 4 of 16 columns fall on blocks, tp 4 of 8 rows not
        const uint64_t before = wl.stats().bytes_read;
        const int64_t n = rows ? 8 : 16;
        const std::vector<float> fp_got =
            host_values(*be, wl.get(spec("fp.weight", {8, 16}, axis, Precision::kFp8Block)));
        const std::vector<float> fp_want = rows ? window(fp_whole, 0, r * 8 / tp, (r + 1) * 8 / tp, 0, 16)
                                                : window(fp_whole, 0, 0, 8, r * 16 / tp, (r + 1) * 16 / tp);
        EXPECT_TRUE(bit_equal(fp_got, fp_want)) << where;
        const bool fp_packed = (n / tp) % 4 == 0;
        EXPECT_EQ(wl.stats().bytes_read - before, fp_packed ? fp_bytes / tp : fp_bytes) << where;
      }
    }
  }
}

// The committed fixtures, loaded rank by rank at tp 2 / 4 and tp 2 x ep 2: each rank reads exactly its share
// (float checkpoints), less than one rank does, and the ranks together read at least the whole of it.
// (That the ranks' models equal one rank's: test_tensor_parallel / test_expert_parallel.)
TEST(RankSlicedFixtures, EveryRankReadsItsShare) {
  for (const char* name : {"glm4_moe_tiny_a", "glm4_moe_tiny_b", "glm_moe_dsa_tiny_a", "glm_moe_dsa_tiny_b"}) {
    const std::string dir = (fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures" / name).string();
    auto cfg = load_model_config(dir);
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    const DeclaredWeights declared = record_weights(*cfg->arch, *cfg, /*include_mtp=*/false);
    auto ckpt = io::Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    auto bound = bind_weights(**ckpt, declared.table, declared.bind);
    ASSERT_TRUE(bound.is_ok()) << bound.status().to_string();
    auto load = [&](int tp, int ep, int r) {
      parallel::RankLayout rank;
      rank.tp = tp, rank.ep = ep, rank.rank = r;
      auto be = backend::make_cpu_backend();
      WeightLoader wl(*be, *bound);
      wl.set_rank(rank, nullptr);
      auto m = cfg->arch->build(*cfg, wl, *be, false);
      EXPECT_TRUE(m.is_ok()) << name << " " << rank.describe() << ": " << m.status().to_string();
      return wl.stats();
    };
    const WeightLoader::LoadStats one = load(1, 1, 0);
    EXPECT_EQ(one.bytes_read, one.bytes_share) << name;
    for (auto [tp, ep] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
      if (tp == 4 && cfg->n_kv_heads > 0 && cfg->n_heads % 4 != 0) continue;
      if (ep > 1 && cfg->n_experts % ep != 0) continue;
      uint64_t sum = 0;
      for (int r = 0; r < tp; ++r) {
        const WeightLoader::LoadStats st = load(tp, ep, r);
        EXPECT_EQ(st.bytes_read, st.bytes_share) << name << " tp " << tp << " ep " << ep << " rank " << r;
        EXPECT_LT(st.bytes_read, one.bytes_read) << name << " tp " << tp << " ep " << ep << " rank " << r;
        sum += st.bytes_read;
      }
      EXPECT_GE(sum, one.bytes_read) << name << " tp " << tp << " ep " << ep;
      EXPECT_LE(sum, static_cast<uint64_t>(tp) * one.bytes_read) << name << " tp " << tp << " ep " << ep;
    }
  }
}

}  // namespace
}  // namespace mxserve::model
