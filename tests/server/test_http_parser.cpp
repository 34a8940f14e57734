// The HTTP layer's pure pieces, in process: the request parser (framing, limits, strictness -- every
// status it can produce), chunked decoding fed byte by byte, the API-key match and log sanitising.
#include <gtest/gtest.h>

#include <string>

#include "server/api_key.h"
#include "server/http/request_parser.h"
#include "server/http/response_writer.h"
#include "server/log_text.h"

namespace mxserve::server::http {
namespace {

HttpLimits small_limits() {
  HttpLimits l;
  l.max_body_bytes = 1000;
  l.max_header_bytes = 2048;
  l.max_header_count = 10;
  l.max_request_line_bytes = 512;
  return l;
}

struct Parsed {
  RequestParser::State state;
  int status = 0;
  Request req;
  size_t consumed = 0;
};

// Feeds `data` in pieces of `step` bytes (keeping unconsumed bytes, as a connection does); runs the body
// phase right after the head.
Parsed parse_all(const HttpLimits& limits, const std::string& data, size_t step = 1 << 20) {
  RequestParser p(limits);
  std::string buf;
  size_t fed = 0, consumed = 0;
  for (;;) {
    const size_t used = p.parse(buf);
    buf.erase(0, used);
    consumed += used;
    if (p.state() == RequestParser::State::kHeadDone) {
      p.begin_body();
      continue;
    }
    if (p.state() == RequestParser::State::kDone || p.state() == RequestParser::State::kError) break;
    if (fed == data.size()) break;
    const size_t n = std::min(step, data.size() - fed);
    buf.append(data, fed, n);
    fed += n;
  }
  Parsed out{p.state(), p.error_status(), {}, consumed};
  if (p.state() == RequestParser::State::kDone) out.req = p.take_request();
  return out;
}

TEST(HttpParser, SimpleGetWithQueryAndHeaders) {
  auto r = parse_all(small_limits(), "GET /health?x=1 HTTP/1.1\r\nHost: a\r\nX-Thing:  v v \r\n\r\n");
  ASSERT_EQ(r.state, RequestParser::State::kDone);
  EXPECT_EQ(r.req.method, "GET");
  EXPECT_EQ(r.req.path, "/health");
  EXPECT_EQ(r.req.query, "x=1");
  EXPECT_EQ(r.req.header("x-thing"), "v v");
  EXPECT_EQ(*r.req.raw_header("x-thing"), "v v ") << "trailing whitespace kept for exact matches";
  EXPECT_EQ(r.req.header("host"), "a");
  EXPECT_TRUE(r.req.body.empty());
}

TEST(HttpParser, ByteByByteEqualsWhole) {
  const std::string chunked =
      "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer-A: x\r\n\r\n";
  for (size_t step : {size_t(1), size_t(3), size_t(7), size_t(1) << 20}) {
    auto r = parse_all(small_limits(), chunked, step);
    ASSERT_EQ(r.state, RequestParser::State::kDone) << step;
    EXPECT_EQ(r.req.body, "hello world") << step;
    EXPECT_EQ(r.consumed, chunked.size()) << "the whole message and nothing more";
  }
  const std::string length = "POST /x HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcdGET";
  auto r = parse_all(small_limits(), length, 2);
  ASSERT_EQ(r.state, RequestParser::State::kDone);
  EXPECT_EQ(r.req.body, "abcd");
}

TEST(HttpParser, PipelinedRequestsStopAtTheBoundary) {
  const std::string two = "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
  RequestParser p(small_limits());
  size_t used = p.parse(two);
  ASSERT_EQ(p.state(), RequestParser::State::kHeadDone);
  p.begin_body();
  EXPECT_EQ(p.take_request().path, "/a");
  used += p.parse(std::string_view(two).substr(used));
  p.begin_body();
  EXPECT_EQ(p.take_request().path, "/b");
  EXPECT_EQ(used, two.size());
}

TEST(HttpParser, KeepAliveRules) {
  RequestParser p(small_limits());
  p.parse("GET / HTTP/1.0\r\n\r\n");
  EXPECT_FALSE(p.keep_alive());
  p.reset();
  p.parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
  EXPECT_TRUE(p.keep_alive());
  p.reset();
  p.parse("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n");
  EXPECT_FALSE(p.keep_alive());
  p.reset();
  p.parse("GET / HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(p.keep_alive());
}

TEST(HttpParser, EveryErrorStatus) {
  const HttpLimits l = small_limits();
  struct Case {
    std::string data;
    int status;
  };
  std::string many_headers = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 11; ++i) many_headers += "X-" + std::to_string(i) + ": v\r\n";
  many_headers += "\r\n";
  const std::vector<Case> cases = {
      {"GET / HTTP/1.1\r\nX: " + std::string(3000, 'a') + "\r\n\r\n", 431},
      {many_headers, 431},
      {"GET /" + std::string(600, 'a') + " HTTP/1.1\r\n\r\n", 414},
      {"POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n", 413},  // 1001 announced by a chunk
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n200\r\n" + std::string(512, 'a') + "\r\n200\r\n", 413},
      {"POST /x HTTP/1.1\r\n\r\n", 411},
      {"POST /x HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", 415},
      {"POST /x HTTP/1.1\r\nContent-Encoding: br\r\nTransfer-Encoding: chunked\r\n\r\n", 415},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX : a\r\n\r\n", 400},
      {std::string("GET / HTTP/1.1\r\nAuthorization: Bearer k") + '\0' + "junk\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"GET /a b HTTP/1.1\r\n\r\n", 400},
      {"GET noslash HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nExpect: something\r\n\r\n", 417},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX", 400},
      {"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
  };
  for (const auto& c : cases) {
    for (size_t step : {size_t(1), size_t(1) << 20}) {
      auto r = parse_all(l, c.data, step);
      EXPECT_EQ(r.state, RequestParser::State::kError) << c.data.substr(0, 80) << " step " << step;
      EXPECT_EQ(r.status, c.status) << c.data.substr(0, 80) << " step " << step;
    }
  }
}

TEST(HttpParser, NeverBuffersPastTheLimits) {
  const HttpLimits l = small_limits();
  // A head that never ends: an error once it passes max_header_bytes, whatever arrives after.
  RequestParser p(l);
  std::string head = "GET / HTTP/1.1\r\n";
  while (head.size() <= l.max_header_bytes) head += "X: y\r\n";
  p.parse(head);
  EXPECT_EQ(p.state(), RequestParser::State::kError);
  EXPECT_EQ(p.error_status(), 431);
  // A chunked body: the chunk that would pass the cap is refused from its size line, before its data.
  RequestParser q(l);
  std::string msg = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  size_t used = q.parse(msg);
  q.begin_body();
  std::string body = "3e8\r\n" + std::string(1000, 'a') + "\r\n1\r\n";
  q.parse(std::string_view(msg).substr(used));
  q.parse(body);
  EXPECT_EQ(q.state(), RequestParser::State::kError);
  EXPECT_EQ(q.error_status(), 413);
  EXPECT_LE(q.request().body.size(), l.max_body_bytes);
}

TEST(HttpParser, LeadingEmptyLinesAndBareLf) {
  auto r = parse_all(small_limits(), "\r\n\r\nGET /a HTTP/1.1\nX: 1\n\n");
  ASSERT_EQ(r.state, RequestParser::State::kDone);
  EXPECT_EQ(r.req.path, "/a");
  EXPECT_EQ(r.req.header("x"), "1");
}

TEST(HttpResponse, FramingAndHeaderInjection) {
  Response res;
  res.status = 503;
  res.set_content("{}", "application/json");
  res.set_header("Retry-After", "1");
  res.set_header("X-Bad", "a\r\nInjected: yes");
  const std::string s = serialize_response(res, 1, false);
  EXPECT_EQ(s.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << s;
  EXPECT_NE(s.find("Content-Length: 2\r\n"), std::string::npos);
  EXPECT_NE(s.find("Connection: close\r\n"), std::string::npos);
  EXPECT_NE(s.find("Retry-After: 1\r\n"), std::string::npos);
  EXPECT_EQ(s.find("Injected"), std::string::npos);
  std::string chunk;
  append_chunk(&chunk, "hello");
  EXPECT_EQ(chunk, "5\r\nhello\r\n");
  append_chunk(&chunk, "");
  EXPECT_EQ(chunk, "5\r\nhello\r\n") << "an empty write must not end the body";
}

}  // namespace
}  // namespace mxserve::server::http

namespace mxserve::server {
namespace {

TEST(ApiKey, ExactBearerMatch) {
  const std::string key = "sk-secret";
  auto ok = [&](const std::string& v) { return bearer_token_matches(&v, key); };
  EXPECT_TRUE(ok("Bearer sk-secret"));
  EXPECT_TRUE(ok("bearer sk-secret"));
  EXPECT_TRUE(ok("BEARER sk-secret"));
  EXPECT_TRUE(ok("Bearer  sk-secret"));
  EXPECT_FALSE(ok("Bearer sk-secret "));
  EXPECT_FALSE(ok("Bearer sk-secret\t"));
  EXPECT_FALSE(ok(std::string("Bearer sk-secret\0junk", 21)));
  EXPECT_FALSE(ok("Bearer sk-secretX"));
  EXPECT_FALSE(ok("Bearer sk-secre"));
  EXPECT_FALSE(ok("Bearer "));
  EXPECT_FALSE(ok("Bearer"));
  EXPECT_FALSE(ok("Bearersk-secret"));
  EXPECT_FALSE(ok("Bearer\tsk-secret"));
  EXPECT_FALSE(ok("Basic sk-secret"));
  EXPECT_FALSE(ok("sk-secret"));
  EXPECT_FALSE(ok(""));
  EXPECT_FALSE(bearer_token_matches(nullptr, key));
  EXPECT_TRUE(constant_time_equals("abc", "abc"));
  EXPECT_FALSE(constant_time_equals("abd", "abc"));
  EXPECT_FALSE(constant_time_equals("", "abc"));
  EXPECT_FALSE(constant_time_equals("abcd", "abc"));
}

TEST(LogText, ControlCharactersEscapedAndCut) {
  EXPECT_EQ(sanitize_for_log("a\nb\r\x1b[31m\\"), "a\\x0ab\\x0d\\x1b[31m\\x5c");
  EXPECT_EQ(sanitize_for_log(std::string(200, 'x'), 10), std::string(10, 'x') + "...");
  EXPECT_EQ(sanitize_for_log(std::string("\0", 1)), "\\x00");
}

}  // namespace
}  // namespace mxserve::server
