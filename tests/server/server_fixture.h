// TestServer: a real mxserve HTTP server on 127.0.0.1 (ephemeral port) serving the committed tiny
// fixture model (tests/fixtures/glm4_moe_tiny_a, vocab 384) with a generated tiny tokenizer, plus
// request helpers that go through libcurl.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "http_client.h"
#include "server/http_server.h"
#include "server/serving_model.h"

namespace mxserve::server::testing {

struct TestServerOptions {
  std::string api_key = "test-key";
  int64_t max_num_seqs = 256;
  int64_t max_queued_requests = 1024;
  size_t max_body_bytes = 4u << 20;
  runtime::SpecConfig spec;     // speculative decoding (off by default)
  bool benchmark_mode = false;  // allows spec.simulate_acceptance
  std::vector<std::string> allowed_origins;  // CORS (off when empty)
  SpecAlarmOptions spec_alarm;  // the MTP acceptance alarm (bound 0: off)
  int64_t num_kv_blocks = 0;             // > 0: a device KV pool of this many blocks (default: 64 MiB)
  uint64_t kv_cache_host_memory = 0;     // the host KV tier (--kv-cache-host-memory; 0: off)
};

class TestServer {
 public:
  explicit TestServer(const TestServerOptions& o = {});
  ~TestServer();

  std::string url(const std::string& path) const;
  HttpResult post(const std::string& path, const std::string& body, bool auth = true) const;
  HttpResult post_json(const std::string& path, const nlohmann::json& body) const { return post(path, body.dump()); }
  HttpResult get(const std::string& path) const;
  SseResult stream(const std::string& path, const nlohmann::json& body, int hang_up_after = -1) const;
  // The value of the first /metrics sample whose line starts with `series` (name plus optional labels).
  double metric(const std::string& series) const;
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  HttpServer& http() { return *http_; }
  const std::string& api_key() const { return api_key_; }

 private:
  std::string tokenizer_dir_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<ServingModel> model_;
  std::unique_ptr<HttpServer> http_;
  std::string api_key_;
};

}  // namespace mxserve::server::testing
