#include "echo_server.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "runtime/executor.h"
#include "server/chat_output.h"
#include "test_tokenizer_files.h"

namespace mxserve::server::testing {
namespace {

constexpr int32_t kFirstGlmId = 300;
// GLM's added tokens; the first six are special (skipped when decoding), the tags are not.
const char* const kGlmTokens[] = {"[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                                  "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                  "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>", "/nothink"};
constexpr int kNumSpecial = 6;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The byte-level test tokenizer plus GLM's added tokens and chat template.
void write_glm_tokenizer(const std::string& dir, const std::string& chat_template) {
  write_test_tokenizer(dir);
  nlohmann::ordered_json tok = nlohmann::ordered_json::parse(read_text(dir + "/tokenizer.json"));
  int32_t id = kFirstGlmId;
  int k = 0;
  for (const char* t : kGlmTokens) {
    tok["added_tokens"].push_back({{"id", id++}, {"content", t}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", k++ < kNumSpecial}});
  }
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  nlohmann::ordered_json cfg;
  cfg["chat_template"] = chat_template;
  cfg["eos_token"] = "<|endoftext|>";
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
}

// Keeps the token of every KV slot (like the runtime tests' FakeModel) so each logit row sees its whole
// context, and puts all probability on the echo's next token.
class EchoExecutor final : public runtime::ModelExecutor {
 public:
  EchoExecutor(int64_t n_blocks, int64_t block_size, int64_t vocab, const tokenizer::Tokenizer& tok)
      : slots_(n_blocks * block_size, -1), block_size_(block_size), vocab_(vocab) {
    user_ = *tok.token_to_id("<|user|>");
    assistant_ = *tok.token_to_id("<|assistant|>");
    observation_ = *tok.token_to_id("<|observation|>");
    nothink_ = *tok.token_to_id("/nothink");
    newline_ = tok.encode("\n", false)->at(0);
    for (const char* t : {"<think>", "<tool_call>", "<arg_key>", "<arg_value>"}) {
      const std::string open = t;
      opens_.push_back(*tok.token_to_id(open));
      closes_.push_back(*tok.token_to_id("</" + open.substr(1)));
    }
    for (int k = kNumSpecial; k < static_cast<int>(std::size(kGlmTokens)); ++k)
      tags_.push_back(*tok.token_to_id(kGlmTokens[k]));
  }
  int64_t vocab_size() const override { return vocab_; }
  Result<runtime::ExecOutput> execute(const model::ForwardBatch& batch) override {
    for (const auto& s : batch.seqs) {
      const int32_t first = s.kv_len - s.n_tokens;
      for (int32_t i = 0; i < s.n_tokens; ++i) slots_[slot(s, first + i)] = batch.token_ids[s.token_begin + i];
    }
    Tensor logits = Tensor::empty(DType::kF32, {static_cast<int64_t>(batch.logit_rows.size()), vocab_});
    std::vector<int32_t> argmax;
    std::vector<int32_t> ctx;
    for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
      const int32_t row = batch.logit_rows[r];
      ctx.clear();
      for (const auto& s : batch.seqs) {
        if (row < s.token_begin || row >= s.token_begin + s.n_tokens) continue;
        const int32_t j = s.kv_len - s.n_tokens + (row - s.token_begin);
        for (int32_t k = 0; k <= j; ++k) ctx.push_back(slots_[slot(s, k)]);
      }
      const int32_t next = next_token(ctx);
      float* l = logits.data<float>() + r * vocab_;
      fallback(ctx, l);
      // 40 above the fallback's best (a closing tag at 20): at temperature 1 (the API's default) the script's token
      // loses with p ~ e^-40. At 30 it lost with p ~ e^-10 = 4.5e-5 per token inside a tag -- a forced-call test's
      // streamed and non-streamed answers then differed about once in a few dozen runs.
      l[next] = 60.f;
      argmax.push_back(next);
    }
    return runtime::ExecOutput{logits, argmax, Tensor()};
  }
  Tensor select_rows(const Tensor& hidden, const std::vector<int32_t>&) override { return hidden; }

 private:
  int32_t next_token(const std::vector<int32_t>& ctx) const {
    const auto a = std::find(ctx.rbegin(), ctx.rend(), assistant_);
    if (a == ctx.rend()) return observation_;
    const auto u = std::find(a, ctx.rend(), user_);
    if (u == ctx.rend()) return observation_;
    const size_t ui = ctx.rend() - u, ai = ctx.rend() - a;  // first index after <|user|>, after <|assistant|>
    std::vector<int32_t> want(ctx.begin() + ui, ctx.begin() + (ai - 1));
    if (!want.empty() && want.front() == newline_) want.erase(want.begin());  // GLM-4.5: "<|user|>\n"
    if (!want.empty() && want.back() == nothink_) want.pop_back();            // thinking off: "/nothink"
    const std::vector<int32_t> have(ctx.begin() + ai, ctx.end());
    if (have.size() >= want.size() || !std::equal(have.begin(), have.end(), want.begin())) return observation_;
    return want[have.size()];
  }
  // Off script (next = <|observation|>), what a grammar may force instead: the closing tag of the innermost
  // open tag of the turn (tag tokens only), then a tag token, then the lowest id. Steps of >= 20 between
  // preferences, so even sampling at temperature 1 picks the top allowed one.
  void fallback(const std::vector<int32_t>& ctx, float* l) const {
    for (int64_t v = 0; v < vocab_; ++v) l[v] = -1000.f - 20.f * static_cast<float>(v);
    for (size_t i = 0; i < tags_.size(); ++i) l[tags_[i]] = -40.f - 20.f * static_cast<float>(i);
    std::vector<size_t> open;  // indices into opens_
    const auto a = std::find(ctx.rbegin(), ctx.rend(), assistant_);
    for (auto it = a.base(); it != ctx.end(); ++it) {
      const auto o = std::find(opens_.begin(), opens_.end(), *it);
      if (o != opens_.end()) open.push_back(static_cast<size_t>(o - opens_.begin()));
      else if (!open.empty() && *it == closes_[open.back()]) open.pop_back();
    }
    if (!open.empty()) l[closes_[open.back()]] = 20.f;
  }
  int64_t slot(const model::SequenceSpan& s, int32_t j) const {
    return static_cast<int64_t>(s.blocks()[j / block_size_]) * block_size_ + j % block_size_;
  }
  std::vector<int32_t> slots_;
  int64_t block_size_, vocab_;
  int32_t user_ = 0, assistant_ = 0, observation_ = 0, nothink_ = 0, newline_ = 0;
  std::vector<int32_t> opens_, closes_, tags_;
};

}  // namespace

EchoServer::EchoServer(const EchoServerOptions& o) {
  static std::atomic<int> counter{0};
  dir_ = (std::filesystem::temp_directory_path() /
          ("mxserve_echo_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
             .string();
  std::filesystem::create_directories(dir_);
  const std::string tmpl =
      read_text(std::string(MXSERVE_SOURCE_DIR) + "/tests/data/tokenizer/templates/" + o.template_name + ".jinja");
  write_glm_tokenizer(dir_, tmpl);
  auto tok = tokenizer::Tokenizer::load_dir(dir_);
  if (!tok.is_ok()) throw std::runtime_error(tok.status().to_string());
  tokenizer_ = std::move(*tok);

  runtime::EngineConfig ec;
  ec.scheduler.block_size = 16;
  ec.n_blocks = 512;
  ec.max_model_len = 4096;
  ec.eos_token_ids = {*tokenizer_->token_to_id("<|observation|>"), *tokenizer_->token_to_id("<|user|>")};
  engine_ = std::make_unique<runtime::Engine>(
      ec, std::make_unique<EchoExecutor>(ec.n_blocks, ec.scheduler.block_size, tokenizer_->vocab_size(), *tokenizer_));
  engine_->start();

  ModelServices s;
  s.engine = engine_.get();
  s.tokenizer = tokenizer_.get();
  s.structured = std::make_shared<structured::StructuredOutputs>(*tokenizer_, tokenizer_->vocab_size());
  auto parsed = tokenizer::ChatTemplate::parse(tmpl);
  if (!parsed.is_ok()) throw std::runtime_error(parsed.status().to_string());
  s.chat_template = std::move(*parsed);
  s.max_model_len = ec.max_model_len;
  auto formats = resolve_output_formats(o.tool_call_parser, o.reasoning_parser, tmpl);
  if (!formats.is_ok()) throw std::runtime_error(formats.status().to_string());
  s.output_formats = *formats;

  ServerOptions so;
  so.port = o.port;
  so.served_model_name = "echo";
  so.api_key = o.api_key;
  so.stats_interval_s = 0;
  http_ = std::make_unique<HttpServer>(so);
  Status st = http_->bind();
  if (!st.is_ok()) throw std::runtime_error(st.to_string());
  http_->start();
  http_->set_ready(std::move(s));
}

EchoServer::~EchoServer() {
  http_->stop();
  engine_->stop();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string EchoServer::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(http_->port()) + path;
}

}  // namespace mxserve::server::testing
