// RequestRecord: everything measured about one request, the input of every metric.
// Owns: field meanings. Times are seconds from the rate point's start on the client's monotonic
// clock. Invariant: for ok requests sent_s <= first_token_s <= last_token_s <= end_s and
// itl_s.size() == token_chunks - 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mxserve::bench {

struct RequestRecord {
  int64_t index = 0;
  bool warmup = false;          // excluded from statistics
  int group = -1;               // shared-prefix group
  int64_t session = -1;         // trace workload: session instance (-1 otherwise)
  int turn = -1;                // trace workload: turn depth within the session, from 0
  int64_t intended_input = -1;  // codec count of the prompt (-1: unknown)
  int64_t intended_output = 0;  // max_tokens sent

  double scheduled_s = 0;       // when the arrival process wanted it sent
  double sent_s = -1;           // when it was handed to the HTTP client (after any client queue)
  double first_token_s = -1;    // first chunk with non-empty content/text/reasoning
  double last_token_s = -1;     // last such chunk
  double end_s = -1;            // transfer finished (after [DONE] / usage)
  std::vector<float> itl_s;     // gaps between consecutive content chunks
  int64_t token_chunks = 0;     // content chunks received

  int64_t output_tokens = -1;   // usage.completion_tokens (-1: not reported)
  int64_t prompt_tokens = -1;   // usage.prompt_tokens
  int64_t cached_tokens = -1;   // usage.prompt_tokens_details.cached_tokens
  bool saw_done = false;

  int http_status = 0;
  bool ok = false;
  std::string error;            // set when !ok: "http 503: ...", "timeout", "connect: ...", ...
  // Streamed text, kept only when the request asked for it (trace workload: the next turn carries it).
  bool capture_text = false;
  std::string output_text;      // delta.content (chat) / text (completions), concatenated
  std::string reasoning_text;   // delta.reasoning_content / delta.reasoning (chat), concatenated

  // Output tokens used by metrics: usage when reported, else the content chunk count.
  int64_t output_tokens_effective() const { return output_tokens >= 0 ? output_tokens : token_chunks; }
  int64_t input_tokens_effective() const { return prompt_tokens >= 0 ? prompt_tokens : intended_input; }
  double ttft() const { return first_token_s - sent_s; }
  double e2e() const { return last_token_s - sent_s; }
};

}  // namespace mxserve::bench
