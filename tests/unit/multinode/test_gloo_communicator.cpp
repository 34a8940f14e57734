// The Gloo communicator (multi-node CPU transport) over 127.0.0.1, three ranks as threads of this process with
// node 0's key-value store in-process: every collective gives the same bits as the CPU thread communicator
// on the same inputs (both reduce in rank order), a mismatched call is an error on every rank, and a rank
// that aborts makes the others' pending collective fail at once (no hang; named).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "parallel/cpu_communicator.h"
#include "parallel/gloo_communicator.h"
#include "parallel/tcp_link.h"

namespace mxserve::parallel {
namespace {

// Node 0's store as a multi-node launch serves it (the session's accept loop, reduced to the store).
class Store {
 public:
  Store() {
    auto l = TcpListener::listen_any(0);
    EXPECT_TRUE(l.is_ok()) << l.status().to_string();
    listener_ = std::move(*l);
    thread_ = std::thread([this] {
      while (!stop_) {
        auto c = listener_.accept(LinkClock::now() + std::chrono::milliseconds(100), "a rank");
        if (!c.is_ok()) continue;
        auto hello = c->recv_frame(LinkClock::now() + std::chrono::seconds(5));
        if (hello.is_ok() && *hello == "KV") server_.serve(std::move(*c));
      }
    });
  }
  ~Store() {
    stop_ = true;
    thread_.join();
    server_.stop();
  }
  int port() const { return listener_.port(); }

 private:
  TcpListener listener_;
  KvStoreServer server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::vector<RankLayout> world(int n) {
  std::vector<RankLayout> out;
  for (int r = 0; r < n; ++r) out.push_back(RankLayout{.tp = n, .rank = r});
  return out;
}

std::vector<std::unique_ptr<Communicator>> gloo_group(const Store& store, int n, std::chrono::milliseconds timeout) {
  GlooOptions o;
  o.timeout = timeout;
  o.store_host = "127.0.0.1";
  o.store_port = store.port();
  o.bind_host = "127.0.0.1";
  auto comms = make_gloo_communicators(world(n), o);
  EXPECT_TRUE(comms.is_ok()) << comms.status().to_string();
  return comms.is_ok() ? std::move(*comms) : std::vector<std::unique_ptr<Communicator>>{};
}

void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

Tensor input(int r, Shape shape, uint32_t seed = 7) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 gen(seed * 131 + r);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(gen) * (i % 3 == 0 ? 1e6f : 1e-3f);
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every collective on rank r of `comms`, outputs in order.
std::vector<Tensor> run_all_collectives(Communicator& c, int r, int n) {
  std::vector<Tensor> out;
  Tensor x = input(r, {3, 5});
  EXPECT_TRUE(c.all_reduce(x, ReduceOp::kSum).is_ok());
  out.push_back(x);
  Tensor m = input(r, {2, 4}, 9);
  EXPECT_TRUE(c.all_reduce(m, ReduceOp::kMax).is_ok());
  out.push_back(m);
  auto g = c.all_gather(input(r, {2, 3}, 11));
  EXPECT_TRUE(g.is_ok());
  out.push_back(*g);
  auto rs = c.reduce_scatter(input(r, {2 * n, 3}, 13), ReduceOp::kSum);
  EXPECT_TRUE(rs.is_ok());
  out.push_back(*rs);
  std::vector<int64_t> send(n);
  int64_t total = 0;
  for (int d = 0; d < n; ++d) total += send[d] = (r + d) % 3;
  std::vector<int64_t> got;
  auto a2a = c.all_to_all(input(r, {total, 4}, 15), send, &got);
  EXPECT_TRUE(a2a.is_ok()) << a2a.status().to_string();
  out.push_back(*a2a);
  std::vector<int64_t> rows;
  auto gv = c.all_gather_v(input(r, {r + 1, 2}, 17), &rows);
  EXPECT_TRUE(gv.is_ok());
  out.push_back(*gv);
  std::vector<int64_t> counts(n);
  int64_t sum = 0;
  for (int d = 0; d < n; ++d) sum += counts[d] = d + 1;
  auto rsv = c.reduce_scatter_v(input(r, {sum, 3}, 19), counts, ReduceOp::kSum);
  EXPECT_TRUE(rsv.is_ok());
  out.push_back(*rsv);
  auto cols = c.all_gather_columns(input(r, {2, 3}, 21));
  EXPECT_TRUE(cols.is_ok());
  out.push_back(*cols);
  EXPECT_TRUE(c.barrier().is_ok());
  return out;
}

TEST(GlooCommunicator, EveryCollectiveBitwiseEqualsTheCpuThreadGroup) {
  const int n = 3;
  Store store;
  auto gloo = gloo_group(store, n, std::chrono::seconds(30));
  ASSERT_EQ(gloo.size(), size_t(n));
  auto cpu = make_cpu_communicators(world(n));
  ASSERT_TRUE(cpu.is_ok());
  std::vector<std::vector<Tensor>> got(n), want(n);
  run_ranks(n, [&](int r) { got[r] = run_all_collectives(*gloo[r], r, n); });
  run_ranks(n, [&](int r) { want[r] = run_all_collectives(*(*cpu)[r], r, n); });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[r].size(), want[r].size());
    for (size_t i = 0; i < got[r].size(); ++i)
      EXPECT_TRUE(bitwise_equal(got[r][i], want[r][i])) << "rank " << r << " collective " << i << ": "
                                                         << got[r][i].describe() << " vs " << want[r][i].describe();
  }
  EXPECT_EQ(gloo[0]->name(), "gloo");
}

TEST(GlooCommunicator, MismatchIsAnErrorOnEveryRank) {
  const int n = 2;
  Store store;
  auto gloo = gloo_group(store, n, std::chrono::seconds(30));
  ASSERT_EQ(gloo.size(), size_t(n));
  std::vector<Status> st(n, Status::ok());
  run_ranks(n, [&](int r) {  // all_gather_v with another column count on rank 1
    st[r] = gloo[r]->all_gather_v(input(r, {2, r == 0 ? 3 : 4}), nullptr).status();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_FALSE(st[r].is_ok()) << "rank " << r;
    EXPECT_NE(st[r].message().find("collective mismatch"), std::string::npos) << st[r].to_string();
  }
}

TEST(GlooCommunicator, AbortFailsThePeersAtOnceNamingTheRank) {
  const int n = 3;
  Store store;
  // A long timeout: the peers must fail because rank 2 closed its connections, not because they waited.
  auto gloo = gloo_group(store, n, std::chrono::seconds(120));
  ASSERT_EQ(gloo.size(), size_t(n));
  std::vector<Status> st(n, Status::ok());
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(n, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      gloo[r]->abort(internal_error("injected"));
      st[r] = gloo[r]->barrier();
      return;
    }
    Tensor x = input(r, {4});
    st[r] = gloo[r]->all_reduce(x, ReduceOp::kSum);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < n; ++r) {
    ASSERT_FALSE(st[r].is_ok()) << "rank " << r;
    EXPECT_NE(st[r].message().find("rank group failed"), std::string::npos) << st[r].to_string();
    EXPECT_NE(st[r].message().find("rank " + std::to_string(r) + "/3 on node"), std::string::npos) << st[r].to_string();
  }
  EXPECT_NE(st[2].message().find("injected"), std::string::npos) << st[2].to_string();
  EXPECT_LT(s, 60.0) << "the peers waited for the timeout instead of failing at the abort";
}

}  // namespace
}  // namespace mxserve::parallel
