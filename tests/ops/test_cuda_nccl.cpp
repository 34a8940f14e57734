// The NCCL communicator (parallel/nccl_communicator.h) with one rank on one GPU: every collective is the
// identity (values compared bit-exactly after the round trip through NCCL), shape and device errors are
// Statuses naming the op, abort() poisons the group; and the glm4_moe fixtures' logits are bitwise the same
// whether the one-rank CUDA launch runs its collectives through NCCL (LaunchConfig::communicator = "nccl",
// the MXSERVE_COMMUNICATOR=nccl switch) or through none. Label gpu; skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "gpu_oracle.h"
#include "launch/launch.h"
#include "parallel/nccl_communicator.h"
#include "runtime/sequence_runner.h"

namespace mxserve::parallel {
namespace {

std::string fixture_root() {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures";
}

class NcclOneRank : public gpu_oracle::CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    be_ = gpu_.get();
    auto comms = make_nccl_communicators({RankLayout{}}, {be_}, nullptr);
    ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
    comm_ = std::move((*comms)[0]);
  }
  // A device tensor of `dtype` holding distinct values, and its host f32 copy.
  Tensor make(DType dtype, Shape shape, Tensor* host_out) {
    Tensor host = Tensor::empty(DType::kF32, shape);
    for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = static_cast<float>((i * 37) % 101 - 50) / 8.f;
    Tensor t = be_->alloc(dtype, shape);
    be_->copy_weight(host, t);
    *host_out = be_->to_host(t);
    return t;
  }
  bool same(const Tensor& device, const Tensor& host) {
    Tensor h = be_->to_host(device);
    return h.shape() == host.shape() && std::memcmp(h.raw(), host.raw(), h.nbytes()) == 0;
  }
  backend::Backend* be_ = nullptr;  // gpu_
  std::unique_ptr<Communicator> comm_;
};

TEST_F(NcclOneRank, EveryCollectiveIsTheIdentity) {
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_EQ(comm_->name(), "nccl x1");
  for (DType dt : {DType::kBF16, DType::kF32}) {
    Tensor h;
    Tensor x = make(dt, {5, 7}, &h);
    ASSERT_TRUE(comm_->all_reduce(x, ReduceOp::kSum).is_ok());
    EXPECT_TRUE(same(x, h)) << "all_reduce sum";
    ASSERT_TRUE(comm_->all_reduce(x, ReduceOp::kMax).is_ok());
    EXPECT_TRUE(same(x, h)) << "all_reduce max";
    auto g = comm_->all_gather(x);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    EXPECT_TRUE(same(*g, h)) << "all_gather";
    auto rs = comm_->reduce_scatter(x, ReduceOp::kSum);
    ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
    EXPECT_TRUE(same(*rs, h)) << "reduce_scatter";
    auto gc = comm_->all_gather_columns(x);
    ASSERT_TRUE(gc.is_ok()) << gc.status().to_string();
    EXPECT_TRUE(same(*gc, h)) << "all_gather_columns";
    std::vector<int64_t> recv;
    auto a2a = comm_->all_to_all(x, {5}, &recv);
    ASSERT_TRUE(a2a.is_ok()) << a2a.status().to_string();
    EXPECT_TRUE(same(*a2a, h)) << "all_to_all";
    EXPECT_EQ(recv, std::vector<int64_t>{5});
    std::vector<int64_t> rows;
    auto gv = comm_->all_gather_v(x, &rows);
    ASSERT_TRUE(gv.is_ok()) << gv.status().to_string();
    EXPECT_TRUE(same(*gv, h)) << "all_gather_v";
    EXPECT_EQ(rows, std::vector<int64_t>{5});
    auto rsv = comm_->reduce_scatter_v(x, {5}, ReduceOp::kSum);
    ASSERT_TRUE(rsv.is_ok()) << rsv.status().to_string();
    EXPECT_TRUE(same(*rsv, h)) << "reduce_scatter_v";
    EXPECT_FALSE(comm_->reduce_scatter_v(x, {4}, ReduceOp::kSum).is_ok()) << "rows must sum to the input's";
  }
  // Zero rows move nothing and still succeed.
  Tensor empty = be_->alloc(DType::kBF16, {0, 4});
  std::vector<int64_t> recv;
  auto a2a = comm_->all_to_all(empty, {0}, &recv);
  ASSERT_TRUE(a2a.is_ok()) << a2a.status().to_string();
  EXPECT_EQ(a2a->dim(0), 0);
  EXPECT_TRUE(comm_->barrier().is_ok());
  std::printf("PASS nccl one-rank identity: all_reduce sum/max, all_gather, reduce_scatter, all_gather_columns, "
              "all_to_all, all_gather_v, reduce_scatter_v, barrier\n");
}

TEST_F(NcclOneRank, ShapeAndDeviceErrorsNameTheOp) {
  Tensor h;
  Tensor x = make(DType::kBF16, {4, 6}, &h);
  auto bad_rows = comm_->all_to_all(x, {3}, nullptr);
  ASSERT_FALSE(bad_rows.is_ok());
  EXPECT_NE(bad_rows.status().message().find("all_to_all: send_rows must name 1 rank(s)"), std::string::npos)
      << bad_rows.status().message();
  EXPECT_FALSE(comm_->all_to_all(x, {4, 0}, nullptr).is_ok());
  Tensor three_d = be_->alloc(DType::kBF16, {2, 2, 2});
  auto cols = comm_->all_gather_columns(three_d);
  ASSERT_FALSE(cols.is_ok());
  EXPECT_NE(cols.status().message().find("all_gather_columns: needs a 2-D tensor"), std::string::npos);
  Tensor scalar = be_->alloc(DType::kF32, {});
  EXPECT_NE(comm_->all_gather(scalar).status().message().find("all_gather: needs a tensor with rows"), std::string::npos);
  Tensor host = Tensor::zeros(DType::kF32, {4});
  const Status on_host = comm_->all_reduce(host, ReduceOp::kSum);
  ASSERT_FALSE(on_host.is_ok());
  EXPECT_NE(on_host.message().find("needs tensors on"), std::string::npos) << on_host.message();
  Tensor bytes = be_->alloc(DType::kU8, {4});
  EXPECT_EQ(comm_->all_reduce(bytes, ReduceOp::kSum).code(), StatusCode::kUnsupported);
  Tensor undefined;
  EXPECT_FALSE(comm_->all_reduce(undefined, ReduceOp::kSum).is_ok());
  std::printf("PASS nccl one-rank errors: send_rows, 3-D columns, 0-d rows, host tensor, u8 reduction, undefined\n");
}

TEST_F(NcclOneRank, AbortPoisonsTheGroupNamingTheRank) {
  comm_->abort(internal_error("the weights of layer 3 did not load"));
  Tensor h;
  Tensor x = make(DType::kF32, {2, 2}, &h);
  const Status s = comm_->all_reduce(x, ReduceOp::kSum);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank 0 failed: the weights of layer 3 did not load"), std::string::npos) << s.message();
  EXPECT_FALSE(comm_->barrier().is_ok());
  std::printf("PASS nccl abort: %s\n", s.message().c_str());
}

// The fixture's logits through the whole model, with and without the one-rank NCCL communicator.
class NcclFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(NcclFixture, LogitsIdenticalWithAndWithoutNccl) {
  if (!backend::make_backend("cuda").is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  std::vector<Tensor> logits[2];
  for (int with_nccl = 0; with_nccl < 2; ++with_nccl) {
    launch::LaunchConfig lc;
    lc.model.path = fixture_root() + "/" + GetParam();
    lc.backend = "cuda";
    lc.communicator = with_nccl ? "nccl" : "auto";
    auto lm = launch::launch_model(lc);
    ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
    EXPECT_EQ((*lm)->communicator().name(), with_nccl ? "nccl x1" : "single-rank");
    const int64_t V = (*lm)->config().vocab_size;
    runtime::SequenceRunner run((*lm)->model(), (*lm)->backend(), 64, 16);
    // Prefill 21 tokens (two sequences in one batch), then 6 decode steps through the paged cache.
    runtime::SequenceState a, b;
    std::vector<int32_t> pa, pb;
    for (int i = 0; i < 21; ++i) pa.push_back(static_cast<int32_t>((i * 37 + 3) % V));
    for (int i = 0; i < 9; ++i) pb.push_back(static_cast<int32_t>((i * 11 + 5) % V));
    auto r = run.extend({&a, &b}, {pa, pb}, true, false);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    logits[with_nccl].push_back(r->logits);
    int64_t last_a = static_cast<int64_t>(pa.size()) - 1, last_b = r->logits.dim(0) - 1;
    for (int step = 0; step < 6; ++step) {
      const int32_t ta = runtime::argmax_row(r->logits, last_a);
      const int32_t tb = runtime::argmax_row(r->logits, last_b);
      last_a = 0;
      last_b = 1;
      r = run.extend({&a, &b}, {{ta}, {tb}}, true, false);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      logits[with_nccl].push_back(r->logits);
    }
    run.release(a);
    run.release(b);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  int64_t differing = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_EQ(logits[0][i].shape(), logits[1][i].shape());
    for (int64_t e = 0; e < logits[0][i].numel(); ++e)
      differing += logits[0][i].data<float>()[e] != logits[1][i].data<float>()[e];
  }
  EXPECT_EQ(differing, 0);
  std::printf("%s %s: logits with and without the one-rank NCCL communicator, %zu steps, %lld differing values\n",
              differing == 0 ? "PASS" : "FAIL", GetParam().c_str(), logits[0].size(), static_cast<long long>(differing));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NcclFixture, ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b"));

}  // namespace
}  // namespace mxserve::parallel
