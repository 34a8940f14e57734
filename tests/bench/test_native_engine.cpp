// The native HTTP/1.1 engine against a raw loopback server that writes hand-made responses in
// small pieces: chunked framing split anywhere, until-close bodies, Content-Length bodies, error
// statuses, keep-alive reuse, and the retry when a reused connection was closed by the server.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bench/load_runner.h"

namespace mxserve::bench {
namespace {

// Serves connections in order; connection i answers requests with responses[i][j], each written
// in pieces of `piece` bytes, 1 ms apart; close_after[i]: close after the last response.
class RawServer {
 public:
  RawServer(std::vector<std::vector<std::string>> responses, size_t piece)
      : responses_(std::move(responses)), piece_(piece) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 16);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~RawServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1/completions"; }
  int accepted() const { return accepted_.load(); }

 private:
  void serve() {
    for (size_t i = 0; i < responses_.size(); ++i) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++accepted_;
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      for (const std::string& resp : responses_[i]) {
        if (!read_request(c)) break;
        for (size_t off = 0; off < resp.size(); off += piece_) {
          send(c, resp.data() + off, std::min(piece_, resp.size() - off), MSG_NOSIGNAL);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      close(c);
    }
  }
  static bool read_request(int c) {
    std::string in;
    char buf[4096];
    while (true) {
      const size_t h = in.find("\r\n\r\n");
      if (h != std::string::npos) {
        const size_t cl = in.find("Content-Length: ");
        const size_t body = cl == std::string::npos ? 0 : std::stoul(in.substr(cl + 16));
        if (in.size() >= h + 4 + body) return true;
      }
      const ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<size_t>(n));
    }
  }
  std::vector<std::vector<std::string>> responses_;
  size_t piece_;
  int fd_ = -1, port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

const std::string kEvents =
    "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
    "data: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";

std::string chunked(const std::string& body, size_t chunk) {
  std::string out = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t off = 0; off < body.size(); off += chunk) {
    const std::string part = body.substr(off, chunk);
    char hex[16];
    std::snprintf(hex, sizeof hex, "%zX", part.size());
    out += std::string(hex) + ";ext=1\r\n" + part + "\r\n";
  }
  return out + "0\r\nX-Trailer: y\r\n\r\n";
}

Result<RunResult> run(const std::string& url, int n, int64_t concurrency = 1) {
  HttpTarget t;
  t.url = url;
  t.request_timeout_s = 10;
  LoadPlan plan;
  plan.max_concurrency = concurrency;
  plan.num_requests = n;
  RunOptions opt;
  opt.http_client = HttpClientKind::kNative;
  BodySource src = [](int64_t) -> Result<RequestSpec> {
    RequestSpec s;
    s.body = R"({"model":"m","prompt":"x","max_tokens":2,"stream":true})";
    return s;
  };
  return run_load(t, plan, src, opt);
}

void expect_two_tokens(const RequestRecord& r) {
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.token_chunks, 2);
  EXPECT_EQ(r.output_tokens, 2);
  EXPECT_EQ(r.prompt_tokens, 3);
  EXPECT_TRUE(r.saw_done);
}

TEST(NativeEngine, ChunkedSplitAnywhereAndKeepAlive) {
  for (size_t piece : {1u, 3u, 7u, 64u}) {
    RawServer server({{chunked(kEvents, 5), chunked(kEvents, 11)}}, piece);
    auto r = run(server.url(), 2);
    ASSERT_TRUE(r.is_ok());
    ASSERT_EQ(r->records.size(), 2u);
    for (const RequestRecord& rec : r->records) expect_two_tokens(rec);
    EXPECT_EQ(server.accepted(), 1) << "the second request reuses the connection";
  }
}

TEST(NativeEngine, UntilCloseAndContentLengthBodies) {
  const std::string until_close = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + kEvents;
  const std::string with_length = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(kEvents.size()) + "\r\n\r\n" + kEvents;
  RawServer server({{until_close}, {with_length}}, 9);
  auto r = run(server.url(), 2);
  ASSERT_TRUE(r.is_ok());
  for (const RequestRecord& rec : r->records) expect_two_tokens(rec);
  EXPECT_EQ(server.accepted(), 2);
}

TEST(NativeEngine, ErrorStatusAndReusedConnectionClosedByServer) {
  const std::string err = "{\"error\":{\"message\":\"overloaded\"}}";
  const std::string e503 = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: " + std::to_string(err.size()) +
                           "\r\nContent-Type: application/json\r\n\r\n" + err;
  // Connection 0 answers once and closes without saying so; request 2 goes to the stale
  // connection, fails before any byte, and is retried on connection 1.
  RawServer server({{e503}, {chunked(kEvents, 8)}}, 16);
  auto r = run(server.url(), 2);
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->records.size(), 2u);
  EXPECT_FALSE(r->records[0].ok);
  EXPECT_EQ(r->records[0].http_status, 503);
  EXPECT_NE(r->records[0].error.find("http 503: {\"error\""), std::string::npos) << r->records[0].error;
  expect_two_tokens(r->records[1]);
  EXPECT_EQ(server.accepted(), 2);
}

TEST(NativeEngine, AServerThatHangsUpMidResponseIsNamedAsSuch) {
  // The head and one event, then the server closes: the record's error is the parser's reason, intact (it was
  // once read from the closed connection's freed memory).
  const std::string partial = chunked(kEvents, 16);
  RawServer server({{partial.substr(0, partial.find("\r\n\r\n") + 4 + 30)}}, 64);
  auto r = run(server.url(), 1);
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->records.size(), 1u);
  EXPECT_FALSE(r->records[0].ok);
  EXPECT_EQ(r->records[0].error, "transport: connection closed mid-response");
}

}  // namespace
}  // namespace mxserve::bench
