// A tiny byte-level BPE tokenizer (259 + merges <= 384 ids, to fit the fixture model's vocabulary) with
// a ChatML-style chat template, written into a directory by the server tests.
#pragma once

#include <string>

namespace mxserve::server::testing {

// Writes tokenizer.json + tokenizer_config.json into dir (created if missing).
void write_test_tokenizer(const std::string& dir);

}  // namespace mxserve::server::testing
