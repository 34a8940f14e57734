// OpenAiStreamReader: turns the SSE events of one streaming chat/completions response into
// RequestRecord timings and usage. Owns: the token-chunk rule (TTFT counts the first chunk whose
// delta.content / delta.reasoning_content / delta.reasoning (chat) or text (completions) is
// non-empty, as sglang does; role-only and usage-only chunks are not tokens), usage parsing, and
// mid-stream `{"error": ...}` events. Invariant: a record gets at most one error string.
#pragma once

#include <cstdint>
#include <string_view>

#include "bench/request_record.h"
#include "bench/sse_parser.h"

namespace mxserve::bench {

// Token test without building a JSON DOM, for the common small content chunk (NOTE: the full
// nlohmann parse cost ~30% of the client's CPU per event at 100k events/s). kNeedsParse: usage,
// error, n > 1 choices or anything unusual -> the full parser decides.
enum class FastChunk { kToken, kNotToken, kNeedsParse };
FastChunk classify_chunk_fast(std::string_view data);

class OpenAiStreamReader {
 public:
  explicit OpenAiStreamReader(RequestRecord* rec) : rec_(rec) {}
  // Bytes of the 200 response body received at time `now_s`.
  void feed(const char* p, size_t n, double now_s);
  // Optional timing probe: events carrying "mx_t" (server CLOCK_MONOTONIC send time, ns) are
  // passed with the client's stamp for that event; used by the client benchmark.
  using ProbeFn = void (*)(void* ctx, int64_t server_send_ns, double client_now_s);
  void set_probe(ProbeFn fn, void* ctx) { probe_ = fn; probe_ctx_ = ctx; }

 private:
  void on_event(std::string_view data, double now_s);
  void on_token(double now_s);
  RequestRecord* rec_;
  SseParser sse_;
  ProbeFn probe_ = nullptr;
  void* probe_ctx_ = nullptr;
};

}  // namespace mxserve::bench
