// EchoServer: a real mxserve HTTP server whose "model" makes its output controllable from the request, for
// end-to-end tests of reasoning and tool-call parsing (the fixture model only prints noise). The tokenizer
// is a small byte-level BPE with GLM's added tokens (<|user|>, <think>, <tool_call>, <arg_key>, ...; the
// tag tokens are not special, as in GLM's tokenizer, so they reach the parsers), the chat template is a
// real GLM template (tests/data/tokenizer/templates), and the EchoExecutor writes back the last user
// message: the assistant turn (generation-prompt tail + generated tokens) becomes that message, token for
// token, then <|observation|> (an EOS). So a request whose user message is
// "<think>hm</think>Sure<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>" gets exactly
// that as model output, through the real engine, detokenizer, parsers and SSE writer. Off script (once
// the output departs from the message, e.g. because a grammar forbade the next token) it wants to end;
// where a grammar forbids that, it prefers to close the innermost open tag (</think>, </arg_value>, ...),
// then a tag token, then the lowest token id -- so a forced tool call comes out short and deterministic.
#pragma once

#include <memory>
#include <string>

#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::server::testing {

struct EchoServerOptions {
  std::string template_name = "GLM-4.5-Air";  // a file under tests/data/tokenizer/templates (without .jinja)
  std::string api_key;
  std::string tool_call_parser;                // "" = detect from the template
  std::string reasoning_parser;
  int port = 0;
};

class EchoServer {
 public:
  explicit EchoServer(const EchoServerOptions& o);
  ~EchoServer();
  int port() const { return http_->port(); }
  std::string url(const std::string& path) const;
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  ServerContext& context() { return http_->context(); }

 private:
  std::string dir_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace mxserve::server::testing
