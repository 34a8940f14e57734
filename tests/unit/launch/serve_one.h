// Test helper of the lockstep recovery tests (CPU and CUDA): one greedy request through an engine, stepped until
// the engine is idle; its tokens, finish reason and error text.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/engine.h"

namespace mxserve::launch::test {

struct Outcome {
  std::vector<int32_t> tokens;
  runtime::FinishReason finish = runtime::FinishReason::kNone;
  std::string error;
};

inline Outcome serve_one(runtime::Engine& engine, std::vector<int32_t> prompt, int32_t max_tokens, int max_steps) {
  Outcome out;
  runtime::RequestSpec req;
  req.prompt = std::move(prompt);
  req.sampling.temperature = 0;
  req.sampling.max_tokens = max_tokens;
  req.sampling.ignore_eos = true;
  EXPECT_TRUE(engine
                  .submit(req,
                          [&out](const runtime::TokenEvent& ev) {
                            if (ev.token >= 0) out.tokens.push_back(ev.token);
                            if (ev.finish != runtime::FinishReason::kNone) out.finish = ev.finish, out.error = ev.error;
                          })
                  .is_ok());
  for (int i = 0; i < max_steps && !engine.idle(); ++i) engine.step();
  EXPECT_TRUE(engine.idle());
  return out;
}

}  // namespace mxserve::launch::test
