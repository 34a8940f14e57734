// FakeOpenAiServer: an in-process OpenAI-compatible streaming server for bench tests and the client
// benchmark. Listens on 127.0.0.1 only (ephemeral port); one epoll thread; a min-heap scheduler
// sends each SSE event at its scripted time. Owns: HTTP/1.1 keep-alive parsing
// (Content-Length bodies), chunked SSE responses, scripted failures, usage with cached_tokens.
// Does not own the script (tests supply it; LruPrefixCache helps simulate prefix caching).
// Invariant: event k of a request is written no earlier than arrival + ttft + sum(gaps[0..k-1]).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace mxserve::bench::testing {

struct FakeRequest {
  int64_t seq = 0;              // arrival order, from 0
  std::string path;             // "/v1/chat/completions" | "/v1/completions"
  nlohmann::json body;
  std::string prompt;           // completions prompt, or the last chat message's content
  int64_t max_tokens = 16;
  int64_t arrival_ns = 0;       // CLOCK_MONOTONIC when the request was fully read
};

struct FakePlan {
  int status = 200;               // != 200: an immediate JSON error with this status
  double ttft_s = 0;              // request arrival -> first token event
  double gap_s = 0;               // between token events (when gaps_s is empty)
  std::vector<double> gaps_s;     // per gap, size tokens-1 (overrides gap_s)
  int64_t tokens = -1;            // token events; -1: max_tokens
  int64_t prompt_tokens = -1;     // usage.prompt_tokens; -1: whitespace word count of the prompt
  int64_t cached_tokens = -1;     // usage.prompt_tokens_details.cached_tokens; -1: omitted
  int64_t completion_tokens = -1; // usage.completion_tokens; -1: tokens
  bool usage = true;              // send the include_usage chunk
  bool error_after_first = false; // send {"error":...} after the first token, then [DONE]
  bool stamp = false;             // add "mx_t": CLOCK_MONOTONIC ns at write time to each event
  bool empty_role_chunk = true;   // chat: an empty role-only delta before the first token (not a token)
  std::string comment;            // an SSE comment line (": ...") sent before the first token
  std::vector<std::string> texts; // the token events' contents (non-empty: one event each, tokens ignored)
};

using FakeScript = std::function<FakePlan(const FakeRequest&)>;

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeScript script);
  ~FakeOpenAiServer();
  // Binds 127.0.0.1:port (0: ephemeral) and starts the thread; returns false on failure.
  bool start(int port = 0);
  void stop();
  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int64_t requests() const { return requests_.load(); }
  // Events due within this window of now are sent together (early by at most the window): fewer
  // wake-ups for a fast server. 0 (default): each event at its time. Set before start().
  int64_t batch_window_ns = 0;
  // CPU seconds used so far by the server thread (for the client benchmark's report).
  double thread_cpu_seconds();
  // Body of GET /metrics (Prometheus text); unset: 404. Set before start(); called on the server thread.
  // GET /health: 503 for the first `health_503_count` probes, then 200 (-1: no /health, 404). Set before start().
  int64_t health_503_count = -1;
  std::atomic<int64_t> health_probes{0};
  std::function<std::string()> metrics_text;

  struct Conn;
 private:
  void loop();
  void on_readable(Conn& c);
  void handle_request(Conn& c, const std::string& method, const std::string& path, const std::string& body);
  void write_out(Conn& c, const std::string& data);
  void flush(Conn& c);
  void close_conn(int fd);
  void send_next_event(Conn& c);

  FakeScript script_;
  int listen_fd_ = -1, epoll_fd_ = -1, stop_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int64_t> requests_{0};
  std::unordered_map<int, Conn*> conns_;
  struct Due {
    int64_t at_ns;
    int fd;
    uint64_t gen;
    bool operator>(const Due& o) const { return at_ns > o.at_ns; }
  };
  std::vector<Due> heap_;
};

// Simulates a server prefix cache: prompts split into whitespace words, grouped into blocks of
// `block` words keyed by the hash of all words so far; LRU over `capacity_blocks` blocks.
// lookup_insert() returns the cached prefix length (in words) and inserts the prompt's blocks.
class LruPrefixCache {
 public:
  LruPrefixCache(int64_t block, int64_t capacity_blocks) : block_(block), capacity_(capacity_blocks) {}
  int64_t lookup_insert(const std::string& prompt);

 private:
  int64_t block_, capacity_;
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> map_;
};

}  // namespace mxserve::bench::testing
