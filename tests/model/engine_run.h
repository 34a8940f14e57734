// Test helper: submits every request to an engine, steps it until idle (its invariants checked after each step) and
// returns each request's tokens by its index in `specs`. The graph tests compare such runs with graphs on and off.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "runtime/engine.h"

namespace mxserve::test {

inline std::map<size_t, std::vector<int32_t>> run_to_idle(runtime::Engine& engine,
                                                         const std::vector<runtime::RequestSpec>& specs) {
  std::map<size_t, std::vector<int32_t>> tokens;
  std::map<runtime::RequestId, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&tokens, &index](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) tokens[index.at(ev.id)].push_back(ev.token);
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    if (id.is_ok()) index[*id] = i;
  }
  while (!engine.idle()) {
    engine.step();
    const Status inv = engine.check_invariants();
    EXPECT_TRUE(inv.is_ok()) << inv.to_string();
  }
  return tokens;
}

}  // namespace mxserve::test
