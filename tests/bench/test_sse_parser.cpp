// SSE framing and OpenAI chunk interpretation: same events for every split of the byte stream.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/openai_stream.h"
#include "bench/sse_parser.h"

namespace mxserve::bench {
namespace {

std::vector<std::string> parse_all(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser p;
  std::vector<std::string> out;
  size_t prev = 0;
  auto sink = [&](std::string_view d) { out.emplace_back(d); };
  for (size_t c : cuts) {
    p.feed(stream.data() + prev, c - prev, sink);
    prev = c;
  }
  p.feed(stream.data() + prev, stream.size() - prev, sink);
  return out;
}

TEST(SseParser, EveryTwoWaySplitGivesTheSameEvents) {
  const std::string s =
      ": keep-alive\n\n"
      "data: {\"a\":1}\n\n"
      "event: x\r\ndata: {\"b\":\r\ndata: 2}\r\n\r\n"
      "id: 7\rdata:[DONE]\r\r";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":\n2}", "[DONE]"};
  ASSERT_EQ(parse_all(s, {}), want);
  for (size_t i = 0; i <= s.size(); ++i)
    for (size_t j = i; j <= s.size(); j += 3) EXPECT_EQ(parse_all(s, {i, j}), want) << "cuts " << i << "," << j;
  std::vector<size_t> bytes;
  for (size_t i = 1; i < s.size(); ++i) bytes.push_back(i);
  EXPECT_EQ(parse_all(s, bytes), want);
}

TEST(OpenAiStreamReader, TokenRuleUsageAndTimes) {
  RequestRecord r;
  r.sent_s = 1.0;
  OpenAiStreamReader reader(&r);
  auto feed = [&](const std::string& s, double t) { reader.feed(s.data(), s.size(), t); };
  feed("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", 1.1);  // not a token
  feed("data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n", 1.25);
  feed("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":null}}]}\n\n", 1.5);
  feed("data: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}]}\n\n", 2.0);
  feed("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,"
       "\"prompt_tokens_details\":{\"cached_tokens\":6}}}\n\ndata: [DONE]\n\n", 2.1);
  EXPECT_DOUBLE_EQ(r.first_token_s, 1.25);
  EXPECT_DOUBLE_EQ(r.last_token_s, 2.0);
  EXPECT_EQ(r.token_chunks, 3);
  ASSERT_EQ(r.itl_s.size(), 2u);
  EXPECT_FLOAT_EQ(r.itl_s[0], 0.25f);
  EXPECT_FLOAT_EQ(r.itl_s[1], 0.5f);
  EXPECT_EQ(r.prompt_tokens, 10);
  EXPECT_EQ(r.output_tokens, 3);
  EXPECT_EQ(r.cached_tokens, 6);
  EXPECT_TRUE(r.saw_done);
  EXPECT_TRUE(r.error.empty());
}

TEST(OpenAiStreamReader, CompletionsTextAndErrors) {
  RequestRecord r;
  OpenAiStreamReader reader(&r);
  const std::string s = "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n";
  reader.feed(s.data(), s.size(), 0.5);
  EXPECT_EQ(r.token_chunks, 1);
  EXPECT_EQ(r.error, "stream error: boom");
  RequestRecord r2;
  OpenAiStreamReader reader2(&r2);
  const std::string bad = "data: {not json\n\n";
  reader2.feed(bad.data(), bad.size(), 0.1);
  EXPECT_NE(r2.error.find("malformed"), std::string::npos);
}

}  // namespace
}  // namespace mxserve::bench

namespace mxserve::bench {
namespace {

// The fast classifier must agree with the full JSON parse wherever it answers.
TEST(ClassifyChunkFast, AgreesWithFullParse) {
  struct Case {
    const char* data;
    FastChunk want;
  };
  const Case cases[] = {
      {R"({"choices":[{"index":0,"delta":{"content":"hi"}}]})", FastChunk::kToken},
      {R"({"choices" : [ {"delta" : {"content" : "x"}} ]})", FastChunk::kToken},
      {R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", FastChunk::kNotToken},
      {R"({"choices":[{"index":0,"delta":{"content":null},"finish_reason":"stop"}]})", FastChunk::kNotToken},
      {R"({"choices":[]})", FastChunk::kNotToken},
      {R"({"choices":[{"text":"a"}]})", FastChunk::kToken},
      {R"({"choices":[{"text":""}]})", FastChunk::kNotToken},
      {R"({"choices":[{"delta":{"reasoning_content":"th"}}]})", FastChunk::kToken},
      {R"({"choices":[{"delta":{"reasoning":"th","content":null}}]})", FastChunk::kToken},
      {R"({"choices":[{"delta":{"content":"say \"content\": \"\""}}]})", FastChunk::kToken},
      {R"({"choices":[{"delta":{"content":"\"text\":\"\""}}]})", FastChunk::kToken},
      {R"({"choices":[],"usage":{"prompt_tokens":1}})", FastChunk::kNeedsParse},
      {R"({"error":{"message":"x"}})", FastChunk::kNeedsParse},
      {R"({"choices":[{"index":0,"text":""},{"index":1,"text":"b"}]})", FastChunk::kNeedsParse},
      {R"({"object":"x"})", FastChunk::kNeedsParse},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(classify_chunk_fast(c.data), c.want) << c.data;
    // Whatever the path, the reader's token count matches the expected class.
    RequestRecord r;
    OpenAiStreamReader reader(&r);
    const std::string ev = std::string("data: ") + c.data + "\n\n";
    reader.feed(ev.data(), ev.size(), 1.0);
    if (c.want == FastChunk::kToken) {
      EXPECT_EQ(r.token_chunks, 1) << c.data;
    } else if (c.want == FastChunk::kNotToken) {
      EXPECT_EQ(r.token_chunks, 0) << c.data;
    }
  }
}

}  // namespace
}  // namespace mxserve::bench
