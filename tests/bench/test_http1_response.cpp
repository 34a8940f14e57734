// Http1Response: same status and body bytes for every split of the response.
#include <gtest/gtest.h>

#include "bench/http1_response.h"

namespace mxserve::bench {
namespace {

struct Parsed {
  Http1Response::State state;
  int status;
  std::string body;
  bool keep_alive;
};

Parsed parse(const std::string& resp, size_t cut, bool eof) {
  Http1Response r;
  std::string body;
  auto sink = [&](const char* p, size_t n) { body.append(p, n); };
  r.feed(resp.data(), cut, sink);
  r.feed(resp.data() + cut, resp.size() - cut, sink);
  if (eof) r.on_eof();
  return {r.state(), r.status(), body, r.keep_alive()};
}

TEST(Http1Response, ChunkedLengthAndUntilCloseInEverySplit) {
  const std::string chunked =
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
      "5;x=y\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: 1\r\n\r\n";
  const std::string length = "HTTP/1.1 503 Unavailable\r\ncontent-length: 4\r\nConnection: close\r\n\r\nbusy";
  const std::string until_close = "HTTP/1.0 200 OK\r\n\r\nstream";
  for (size_t cut = 0; cut <= chunked.size(); ++cut) {
    const Parsed p = parse(chunked, cut, false);
    ASSERT_EQ(p.state, Http1Response::State::kDone) << cut;
    EXPECT_EQ(p.status, 200);
    EXPECT_EQ(p.body, "hello 0123456789");
    EXPECT_TRUE(p.keep_alive);
  }
  for (size_t cut = 0; cut <= length.size(); ++cut) {
    const Parsed p = parse(length, cut, false);
    ASSERT_EQ(p.state, Http1Response::State::kDone) << cut;
    EXPECT_EQ(p.status, 503);
    EXPECT_EQ(p.body, "busy");
    EXPECT_FALSE(p.keep_alive);
  }
  const Parsed u = parse(until_close, 20, true);
  EXPECT_EQ(u.state, Http1Response::State::kDone);
  EXPECT_EQ(u.body, "stream");
  EXPECT_FALSE(u.keep_alive);
}

TEST(Http1Response, Errors) {
  EXPECT_EQ(parse("garbage\r\n\r\n", 3, false).state, Http1Response::State::kError);
  EXPECT_EQ(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 5, false).state,
            Http1Response::State::kError);
  EXPECT_EQ(parse("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 5, true).state, Http1Response::State::kError);
  EXPECT_EQ(parse("", 0, true).state, Http1Response::State::kError);
}

}  // namespace
}  // namespace mxserve::bench
