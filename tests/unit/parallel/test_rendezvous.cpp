// The multi-node TCP rendezvous (parallel/rendezvous.h) with nodes as threads on localhost: the payload
// (an NCCL id: binary, with NUL bytes) reaches every node; a node with the wrong --nnodes, a node rank given
// twice, a missing node and a missing node 0 each fail every node involved with an error naming the culprit,
// within the timeout.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "parallel/rendezvous.h"

namespace mxserve::parallel {
namespace {

using std::chrono::milliseconds;

// A port nothing listens on right now (bind to 0, read it back, close).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

DistInit node(int nnodes, int rank, int port) {
  DistInit d;
  d.nnodes = nnodes;
  d.node_rank = rank;
  d.host = "127.0.0.1";
  d.port = port;
  return d;
}

// Runs every node on its own thread; results in node order.
std::vector<Result<std::string>> run_nodes(const std::vector<DistInit>& nodes, const std::string& payload,
                                           milliseconds timeout) {
  std::vector<std::optional<Result<std::string>>> out(nodes.size());
  std::vector<std::thread> threads;
  RendezvousOptions opt;
  opt.timeout = timeout;
  for (size_t i = 0; i < nodes.size(); ++i)
    threads.emplace_back([&, i] { out[i] = rendezvous_share(nodes[i], nodes[i].node_rank == 0 ? payload : "", opt); });
  for (auto& t : threads) t.join();
  std::vector<Result<std::string>> results;
  for (auto& r : out) results.push_back(std::move(*r));
  return results;
}

TEST(Rendezvous, ParsesAndValidatesTheFlags) {
  DistInit d;
  ASSERT_TRUE(parse_dist_init_addr("10.0.0.1:5000", &d).is_ok());
  EXPECT_EQ(d.host, "10.0.0.1");
  EXPECT_EQ(d.port, 5000);
  ASSERT_TRUE(parse_dist_init_addr("[::1]:29500", &d).is_ok());
  EXPECT_EQ(d.host, "::1");
  for (const char* bad : {"10.0.0.1", "10.0.0.1:", ":5000", "h:0", "h:70000", "h:12x"}) {
    const Status s = parse_dist_init_addr(bad, &d);
    EXPECT_FALSE(s.is_ok()) << bad;
    EXPECT_NE(s.message().find("--dist-init-addr"), std::string::npos) << s.message();
  }
  DistInit v = node(2, 2, 5000);
  EXPECT_NE(validate_dist_init(v).message().find("--node-rank 2 must be in 0..1"), std::string::npos);
  v = node(2, 1, 0);
  v.host.clear();
  EXPECT_NE(validate_dist_init(v).message().find("needs --dist-init-addr"), std::string::npos);
  EXPECT_TRUE(validate_dist_init(DistInit{}).is_ok());
}

TEST(Rendezvous, OneNodeNeedsNoNetwork) {
  auto r = rendezvous_share(DistInit{}, "id");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, "id");
}

TEST(Rendezvous, EveryNodeGetsNodeZerosPayload) {
  std::string payload(128, '\0');
  for (int i = 0; i < 128; i += 3) payload[i] = static_cast<char>(i * 7 + 1);
  const int port = free_port();
  // Followers first: they retry until node 0 listens.
  auto results = run_nodes({node(3, 2, port), node(3, 1, port), node(3, 0, port)}, payload, milliseconds(10000));
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].is_ok()) << i << ": " << results[i].status().to_string();
    EXPECT_EQ(*results[i], payload) << i;
  }
}

TEST(Rendezvous, WrongWorldSizeFailsBothNodesNamingTheNode) {
  const int port = free_port();
  auto results = run_nodes({node(2, 0, port), node(3, 1, port)}, "id", milliseconds(5000));
  ASSERT_FALSE(results[0].is_ok());
  ASSERT_FALSE(results[1].is_ok());
  const std::string want = "node 1 was started with --nnodes 3, node 0 with --nnodes 2";
  EXPECT_NE(results[0].status().message().find(want), std::string::npos) << results[0].status().message();
  EXPECT_NE(results[1].status().message().find(want), std::string::npos) << results[1].status().message();
}

TEST(Rendezvous, ANodeRankGivenTwiceFails) {
  const int port = free_port();
  auto results = run_nodes({node(3, 0, port), node(3, 1, port), node(3, 1, port)}, "id", milliseconds(5000));
  for (size_t i = 0; i < results.size(); ++i) EXPECT_FALSE(results[i].is_ok()) << i;
  EXPECT_NE(results[0].status().message().find("--node-rank 1 was given to two nodes"), std::string::npos)
      << results[0].status().message();
}

TEST(Rendezvous, AMissingNodeTimesOutNamingIt) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  auto results = run_nodes({node(3, 0, port), node(3, 2, port)}, "id", milliseconds(500));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(results[0].is_ok());
  EXPECT_NE(results[0].status().message().find("node(s) 1 never connected"), std::string::npos)
      << results[0].status().message();
  ASSERT_FALSE(results[1].is_ok());
  EXPECT_NE(results[1].status().message().find("node 0 gave up"), std::string::npos) << results[1].status().message();
  EXPECT_LT(s, 5.0);
}

TEST(Rendezvous, NoNodeZeroTimesOut) {
  const int port = free_port();
  auto results = run_nodes({node(2, 1, port)}, "", milliseconds(400));
  ASSERT_FALSE(results[0].is_ok());
  EXPECT_NE(results[0].status().message().find("node 0 was not reachable at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << results[0].status().message();
}

}  // namespace
}  // namespace mxserve::parallel
