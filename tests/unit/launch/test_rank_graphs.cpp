// Per-rank CUDA graphs (launch/rank_graphs.h) on the CPU: which lockstep layout gets which graphs and the refusal
// texts (choose_tp_graph_mode), the attention metadata's mirrors (tree pointers re-aimed), and PerRankGraphs'
// orchestration over a recording fake of the CUDA side (parallel::RankCapture) with fake rank models: the body's
// forward_device recorded once, every rank's capture on its own thread, rank r > 0 reading copies of rank 0's
// inputs (rank 0 in place), the event order of a replay (rank 0's mark before every rank's wait; every rank's
// mark before rank 0 joins), and a rank whose launch fails failing the replay, named. The CUDA run of the same
// path is test_cuda_rank_graphs (label gpu).
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "launch/rank_graphs.h"

namespace mxserve::launch {
namespace {

TpGraphChoice choose(std::vector<int> devices, int tp, int dp = 1, const char* env = nullptr, bool force = false) {
  TpGraphLayout l;
  l.devices = std::move(devices);
  l.tp = tp;
  l.dp = dp;
  l.tp_graphs_env = env;
  l.force_per_rank = force;
  return choose_tp_graph_mode(l);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(RankGraphs, ModeFollowsTheRanksDevices) {
  EXPECT_EQ(choose({0, 0}, 2).mode, TpGraphMode::kJoined);        // the shared-device stand-in
  EXPECT_EQ(choose({0, 0, 0, 0}, 4).mode, TpGraphMode::kJoined);
  // NCCL, one GPU per rank: opt-in (MXSERVE_TP_GRAPHS=1) until a several-GPU run proves them
  EXPECT_EQ(choose({0, 1}, 2).mode, TpGraphMode::kRefused);
  EXPECT_TRUE(has(choose({0, 1}, 2).why, "MXSERVE_TP_GRAPHS=1")) << choose({0, 1}, 2).why;
  EXPECT_EQ(choose({4, 5, 6, 7}, 4, 1, "1").mode, TpGraphMode::kPerRank);
  EXPECT_EQ(choose({0, 1}, 2, 1, "1").mode, TpGraphMode::kPerRank);
  // DP on the stand-in: the joined capture of the groups' slot ranges (on by default)
  EXPECT_EQ(choose({0, 0, 0, 0}, 2, 2).mode, TpGraphMode::kJoined);
  EXPECT_EQ(choose({0, 0, 0, 0}, 2, 2, "0").mode, TpGraphMode::kRefused);
  EXPECT_EQ(choose({0}, 1).mode, TpGraphMode::kJoined);           // one rank: its own capture
  EXPECT_EQ(choose({0}, 1, 1, nullptr, true).mode, TpGraphMode::kPerRank);  // the tests' one-rank NCCL world
}

TEST(RankGraphs, RefusalsNameWhy) {
  const TpGraphChoice standin_forced = choose({0, 0}, 2, 1, nullptr, true);
  EXPECT_EQ(standin_forced.mode, TpGraphMode::kRefused);
  EXPECT_TRUE(has(standin_forced.why, "unsound")) << standin_forced.why;
  EXPECT_TRUE(has(standin_forced.why, "graph_join.h")) << standin_forced.why;
  const TpGraphChoice mixed = choose({0, 1, 1, 2}, 4);
  EXPECT_EQ(mixed.mode, TpGraphMode::kRefused);
  EXPECT_TRUE(has(mixed.why, "ranks 1 and 2 share GPU 1")) << mixed.why;
  const TpGraphChoice dp = choose({0, 1, 2, 3}, 2, 2, "1");  // DP on NCCL ranks: not built
  EXPECT_EQ(dp.mode, TpGraphMode::kRefused);
  EXPECT_TRUE(has(dp.why, "--data-parallel-size 2")) << dp.why;
  const TpGraphChoice node = choose({0, 1}, 4);  // this node's 2 of 4 tp ranks
  EXPECT_EQ(node.mode, TpGraphMode::kRefused);
  EXPECT_TRUE(has(node.why, "--nnodes > 1")) << node.why;
  EXPECT_TRUE(has(node.why, "follower")) << node.why;
  EXPECT_TRUE(has(node.why, "2 of 4")) << node.why;
  EXPECT_TRUE(has(multinode_graphs_refusal(), "capture its own ranks' graphs"));
  const TpGraphChoice off = choose({0, 1}, 2, 1, "0");
  EXPECT_EQ(off.mode, TpGraphMode::kRefused);
  EXPECT_TRUE(has(off.why, "MXSERVE_TP_GRAPHS=0")) << off.why;
  const TpGraphChoice off_standin = choose({0, 0}, 2, 1, "0");
  EXPECT_EQ(off_standin.mode, TpGraphMode::kRefused);
  const TpGraphChoice cpu = choose({-1, -1}, 2);
  EXPECT_EQ(cpu.mode, TpGraphMode::kRefused);
  EXPECT_TRUE(has(cpu.why, "not CUDA ranks")) << cpu.why;
}

Tensor i32(std::vector<int32_t> v) {
  Tensor t = Tensor::empty(DType::kI32, {static_cast<int64_t>(v.size())});
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

TEST(RankGraphs, MirroredMetaReaimsTheTreePointers) {
  backend::AttentionMeta meta;
  meta.token_seq = i32({0, 1});
  meta.kv_index = i32({3, 4});
  meta.slot_mapping = i32({7, 8});
  meta.block_tables = i32({0, 1, 2, 3});
  meta.tree_mask = Tensor::zeros(DType::kI64, {2});
  meta.tree_base = i32({1, 1});
  meta.params.tree_mask = static_cast<const uint64_t*>(meta.tree_mask.raw());
  meta.params.tree_base = meta.tree_base.data<int32_t>();
  meta.params.n_tokens = 2;
  int mirrored = 0;
  auto copy = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return t;
    ++mirrored;
    Tensor c = Tensor::empty(t.dtype(), t.shape());
    std::memcpy(c.raw(), t.raw(), t.nbytes());
    return c;
  };
  const backend::AttentionMeta m = mirror_attention_meta(meta, copy);
  EXPECT_EQ(mirrored, 6);  // every defined tensor (cascade is undefined here)
  EXPECT_FALSE(m.cascade.defined());
  EXPECT_NE(m.block_tables.raw(), meta.block_tables.raw());
  EXPECT_EQ(m.block_tables.data<int32_t>()[3], 3);
  EXPECT_EQ(m.params.tree_mask, static_cast<const uint64_t*>(m.tree_mask.raw()));
  EXPECT_EQ(m.params.tree_base, m.tree_base.data<int32_t>());
  EXPECT_EQ(m.params.n_tokens, 2);
  backend::AttentionMeta plain;  // a plain batch keeps null tree pointers
  plain.token_seq = i32({0});
  EXPECT_EQ(mirror_attention_meta(plain, copy).params.tree_mask, nullptr);
}

// ---- PerRankGraphs over fakes ----

struct Log {
  std::mutex mu;
  std::vector<std::string> events;
  void add(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
  int index(const std::string& e) {
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i] == e) return static_cast<int>(i);
    return -1;
  }
};

class FakeGraph final : public backend::DeviceGraph {
 public:
  explicit FakeGraph(std::function<void()> body) : body_(std::move(body)) {}
  void replay() override { body_(); }
  std::function<void()> body_;
};

class FakeCapture final : public parallel::RankCapture {
 public:
  explicit FakeCapture(Log& log) : log_(log) {}
  bool root_capturing() override { return false; }
  Status mark_root() override {
    log_.add("mark_root");
    return Status::ok();
  }
  Status wait_root(int r) override {
    log_.add("wait_root " + std::to_string(r));
    return Status::ok();
  }
  Status copy_from_root(int r, const Tensor& src, Tensor& dst) override {
    if (src.nbytes() != dst.nbytes()) return internal_error("size");
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return Status::ok();
  }
  // As the CUDA backend: the body runs once eagerly, then "captured" (here: kept and rerun at each launch).
  Result<std::unique_ptr<backend::DeviceGraph>> capture(int r, const std::function<void()>& body) override {
    log_.add("capture " + std::to_string(r));
    body();
    if (r == fail_capture_rank) return internal_error("CUDA graph capture failed: injected capture failure");
    return std::unique_ptr<backend::DeviceGraph>(std::make_unique<FakeGraph>(body));
  }
  Status launch(int r, backend::DeviceGraph& g) override {
    if (r == fail_launch_rank) return internal_error("cudaGraphLaunch: injected failure");
    log_.add("launch " + std::to_string(r));
    g.replay();
    return Status::ok();
  }
  Status mark_rank(int r) override {
    log_.add("mark_rank " + std::to_string(r));
    return Status::ok();
  }
  Status join_ranks() override {
    log_.add("join_ranks");
    return Status::ok();
  }
  int fail_launch_rank = -1, fail_capture_rank = -1;
  Log& log_;
};

// A rank model whose forward_device records what it read: ids' address and values, and the block table's.
class FakeRankModel final : public model::CausalLM {
 public:
  const model::ModelConfig& config() const override { return cfg_; }
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override { return {}; }
  bool has_mtp() const override { return false; }
  Result<model::ForwardOutput> forward(const model::ForwardBatch&, kvcache::KvCache&) override {
    return unsupported("fake");
  }
  Result<model::ForwardOutput> forward_mtp(const model::ForwardBatch&, const Tensor&, kvcache::KvCache&) override {
    return unsupported("fake");
  }
  Status forward_device(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                        kvcache::KvCache& kv, Tensor& logits, Tensor* hidden) override {
    ++calls;
    if (fail) return internal_error("injected forward failure");
    ids_at = ids.raw();
    ids_seen.assign(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel());
    tables_seen.assign(meta.block_tables.data<int32_t>(), meta.block_tables.data<int32_t>() + meta.block_tables.numel());
    logits.data<float>()[0] = static_cast<float>(ids_seen[0]);
    return Status::ok();
  }
  model::ModelConfig cfg_;
  int calls = 0;
  bool fail = false;
  const void* ids_at = nullptr;
  std::vector<int32_t> ids_seen, tables_seen;
};

struct Rig {
  Log log;
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::vector<std::unique_ptr<FakeRankModel>> models;
  FakeCapture* capture = nullptr;
  int failed_jobs = 0;
  std::unique_ptr<PerRankGraphs> graphs;
  kvcache::KvCache kv{kvcache::KvCacheSpec::gqa(1, 2, 4, 1, 4, DType::kF32),
                      [](DType dt, Shape s) { return Tensor::zeros(dt, std::move(s)); }};
  explicit Rig(int world, bool mirror_rank0 = false) {
    std::vector<PerRankGraphs::RankSide> sides;
    for (int r = 0; r < world; ++r) {
      models.push_back(std::make_unique<FakeRankModel>());
      sides.push_back({be.get(), models.back().get()});
    }
    auto cap = std::make_unique<FakeCapture>(log);
    capture = cap.get();
    // One thread per rank per call, as the lockstep model's workers; the first error (rank order).
    // (failed_jobs: the jobs that returned an error -- the lockstep model aborts the group for those.)
    auto run = [this](kvcache::KvCache& kv, const PerRankGraphs::RankFn& fn, int n) -> Status {
      std::vector<Status> st(n, Status::ok());
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { st[r] = fn(r, kv); });
      for (auto& t : threads) t.join();
      for (const Status& s : st) failed_jobs += s.is_ok() ? 0 : 1;
      for (const Status& s : st) MX_RETURN_IF_ERROR(s);
      return Status::ok();
    };
    graphs = std::make_unique<PerRankGraphs>(
        std::move(sides), std::move(cap),
        [run, world](kvcache::KvCache& kv, const PerRankGraphs::RankFn& fn) { return run(kv, fn, world); },
        mirror_rank0);
  }
};

TEST(RankGraphs, CaptureAndReplayGiveEveryRankRankZerosInputs) {
  Rig rig(2);
  Tensor ids = i32({5, 6}), positions = i32({0, 1}), logits = Tensor::zeros(DType::kF32, {2, 3});
  backend::AttentionMeta meta;
  meta.token_seq = i32({0, 1});
  meta.kv_index = i32({0, 1});
  meta.slot_mapping = i32({0, 1});
  meta.block_tables = i32({0, 1, 2, 3});
  // The decode graphs' body: one forward_device call through the (lockstep) model, recorded here.
  auto body = [&] {
    ASSERT_TRUE(rig.graphs->recording());
    ASSERT_TRUE(rig.graphs->record(ids, positions, meta, rig.kv, logits, nullptr).is_ok());
  };
  auto g = rig.graphs->capture(body);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_FALSE(rig.graphs->recording());
  EXPECT_GE(rig.log.index("capture 0"), 0);
  EXPECT_GE(rig.log.index("capture 1"), 0);
  EXPECT_EQ(rig.models[0]->ids_at, ids.raw());  // rank 0 in place
  EXPECT_NE(rig.models[1]->ids_at, ids.raw());  // rank 1: its mirror
  EXPECT_EQ(rig.models[1]->ids_seen, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(rig.models[1]->tables_seen, (std::vector<int32_t>{0, 1, 2, 3}));
  // The engine rewrites rank 0's buffers in place before the replay: rank 1 must read this step's values.
  ids.data<int32_t>()[0] = 9;
  meta.block_tables.data<int32_t>()[2] = 11;
  rig.log.events.clear();
  const void* mirror = rig.models[1]->ids_at;
  ASSERT_TRUE(rig.graphs->owns(**g));
  const Status st = rig.graphs->replay(**g);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(rig.graphs->replays(), 1);
  EXPECT_EQ(rig.models[1]->ids_at, mirror);  // the same mirror (allocated once)
  EXPECT_EQ(rig.models[1]->ids_seen, (std::vector<int32_t>{9, 6}));
  EXPECT_EQ(rig.models[1]->tables_seen, (std::vector<int32_t>{0, 1, 11, 3}));
  EXPECT_EQ(logits.data<float>()[0], 9.f);  // rank 0's output is the caller's buffer
  // Order: rank 0's mark, then each rank waits before it launches and marks after; rank 0 joins last.
  const int mark = rig.log.index("mark_root"), join = rig.log.index("join_ranks");
  ASSERT_GE(mark, 0);
  EXPECT_EQ(join, static_cast<int>(rig.log.events.size()) - 1);
  for (int r = 0; r < 2; ++r) {
    const int w = rig.log.index("wait_root " + std::to_string(r)), l = rig.log.index("launch " + std::to_string(r)),
              m = rig.log.index("mark_rank " + std::to_string(r));
    EXPECT_LT(mark, w);
    EXPECT_LT(w, l);
    EXPECT_LT(l, m);
    EXPECT_LT(m, join);
  }
}

TEST(RankGraphs, MirrorRankZeroCopiesOnRankZeroToo) {
  Rig rig(1, /*mirror_rank0=*/true);
  Tensor ids = i32({3}), positions = i32({0}), logits = Tensor::zeros(DType::kF32, {1, 2});
  backend::AttentionMeta meta;
  meta.block_tables = i32({1});
  auto g = rig.graphs->capture([&] { (void)rig.graphs->record(ids, positions, meta, rig.kv, logits, nullptr); });
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_NE(rig.models[0]->ids_at, ids.raw());
  EXPECT_EQ(rig.models[0]->ids_seen, (std::vector<int32_t>{3}));
  EXPECT_EQ(logits.data<float>()[0], 3.f);
}

TEST(RankGraphs, FailedLaunchFailsTheReplayNamingTheRank) {
  Rig rig(2);
  Tensor ids = i32({1}), positions = i32({0}), logits = Tensor::zeros(DType::kF32, {1, 2});
  backend::AttentionMeta meta;
  meta.block_tables = i32({0});
  auto g = rig.graphs->capture([&] { (void)rig.graphs->record(ids, positions, meta, rig.kv, logits, nullptr); });
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  rig.capture->fail_launch_rank = 1;
  const Status st = rig.graphs->replay(**g);
  EXPECT_FALSE(st.is_ok());
  EXPECT_TRUE(has(st.message(), "rank 1")) << st.to_string();
  EXPECT_TRUE(has(st.message(), "injected failure")) << st.to_string();
  EXPECT_EQ(rig.graphs->replays(), 0);
  EXPECT_GE(rig.log.index("join_ranks"), 0);  // rank 0's stream still ordered after the ranks
}

// A capture that fails after the forward ran: named, the group left alone (the engine runs eagerly). A forward that
// fails: named and returned from the rank's job (the lockstep model aborts the group).
TEST(RankGraphs, FailedCaptureOrForwardIsNamed) {
  Tensor ids = i32({1}), positions = i32({0}), logits = Tensor::zeros(DType::kF32, {1, 2});
  backend::AttentionMeta meta;
  meta.block_tables = i32({0});
  {
    Rig rig(2);
    rig.capture->fail_capture_rank = 1;
    auto g = rig.graphs->capture([&] { (void)rig.graphs->record(ids, positions, meta, rig.kv, logits, nullptr); });
    ASSERT_FALSE(g.is_ok());
    EXPECT_TRUE(has(g.status().message(), "rank 1")) << g.status().to_string();
    EXPECT_TRUE(has(g.status().message(), "injected capture failure")) << g.status().to_string();
    EXPECT_EQ(rig.failed_jobs, 0);
  }
  {
    Rig rig(2);
    rig.models[1]->fail = true;
    auto g = rig.graphs->capture([&] { (void)rig.graphs->record(ids, positions, meta, rig.kv, logits, nullptr); });
    ASSERT_FALSE(g.is_ok());
    EXPECT_TRUE(has(g.status().message(), "rank 1")) << g.status().to_string();
    EXPECT_TRUE(has(g.status().message(), "injected forward failure")) << g.status().to_string();
    EXPECT_EQ(rig.failed_jobs, 1);
  }
}

TEST(RankGraphs, BodyWithoutOneForwardIsRefused) {
  Rig rig(2);
  auto none = rig.graphs->capture([] {});
  EXPECT_FALSE(none.is_ok());
  EXPECT_TRUE(has(none.status().message(), "made 0")) << none.status().to_string();
  Tensor ids = i32({1}), positions = i32({0}), logits = Tensor::zeros(DType::kF32, {1, 2});
  backend::AttentionMeta meta;
  auto two = rig.graphs->capture([&] {
    (void)rig.graphs->record(ids, positions, meta, rig.kv, logits, nullptr);
    (void)rig.graphs->record(ids, positions, meta, rig.kv, logits, nullptr);
  });
  EXPECT_FALSE(two.is_ok());
  EXPECT_TRUE(has(two.status().message(), "made 2")) << two.status().to_string();
  EXPECT_EQ(rig.log.index("capture 0"), -1);  // nothing captured
}

}  // namespace
}  // namespace mxserve::launch
