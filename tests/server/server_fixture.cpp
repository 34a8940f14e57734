#include "server_fixture.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "test_tokenizer_files.h"

namespace mxserve::server::testing {

TestServer::TestServer(const TestServerOptions& o) : api_key_(o.api_key) {
  static std::atomic<int> counter{0};
  tokenizer_dir_ = (std::filesystem::temp_directory_path() /
                    ("mxserve_server_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
                       .string();
  write_test_tokenizer(tokenizer_dir_);
  auto tok = tokenizer::Tokenizer::load_dir(tokenizer_dir_);
  if (!tok.is_ok()) throw std::runtime_error(tok.status().to_string());
  tokenizer_ = std::move(*tok);

  ServingConfig sc;
  sc.model_path = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";
  sc.tokenizer_dir = tokenizer_dir_;
  sc.max_num_seqs = o.max_num_seqs;
  sc.max_queued_requests = o.max_queued_requests;
  sc.kv_cache_bytes = 64u << 20;
  sc.num_kv_blocks = o.num_kv_blocks;
  sc.kv_cache_host_memory = o.kv_cache_host_memory;
  sc.spec = o.spec;
  sc.benchmark_mode = o.benchmark_mode;
  auto model = ServingModel::load(sc);
  if (!model.is_ok()) throw std::runtime_error(model.status().to_string());
  model_ = std::move(*model);

  ServerOptions so;
  so.port = 0;
  so.served_model_name = "tiny";
  so.api_key = o.api_key;
  so.http.max_body_bytes = o.max_body_bytes;
  so.stats_interval_s = 0;
  so.allowed_origins = o.allowed_origins;
  so.spec_alarm = o.spec_alarm;
  http_ = std::make_unique<HttpServer>(so);
  Status s = http_->bind();
  if (!s.is_ok()) throw std::runtime_error(s.to_string());
  http_->start();
  http_->set_ready(model_->services());
}

TestServer::~TestServer() {
  http_->stop();
  model_.reset();
  std::error_code ec;
  std::filesystem::remove_all(tokenizer_dir_, ec);
}

std::string TestServer::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(http_->port()) + path;
}

HttpResult TestServer::post(const std::string& path, const std::string& body, bool auth) const {
  std::vector<std::string> h = {"Content-Type: application/json"};
  if (auth && !api_key_.empty()) h.push_back("Authorization: Bearer " + api_key_);
  return http_request("POST", url(path), body, h);
}

HttpResult TestServer::get(const std::string& path) const {
  std::vector<std::string> h;
  if (!api_key_.empty()) h.push_back("Authorization: Bearer " + api_key_);
  return http_request("GET", url(path), "", h);
}

SseResult TestServer::stream(const std::string& path, const nlohmann::json& body, int hang_up_after) const {
  std::vector<std::string> h = {"Content-Type: application/json"};
  if (!api_key_.empty()) h.push_back("Authorization: Bearer " + api_key_);
  return http_stream(url(path), body.dump(), h, hang_up_after);
}

double TestServer::metric(const std::string& series) const {
  const HttpResult r = get("/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series, 0) != 0) continue;
    const char next = line.size() > series.size() ? line[series.size()] : ' ';
    if (next != '{' && next != ' ' && next != ',') continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  throw std::runtime_error("metric " + series + " not found");
}

}  // namespace mxserve::server::testing
