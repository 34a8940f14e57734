// Shared plumbing of the `mxserve eval` subcommands (cmd_eval*.cpp): loading a model at a chosen precision
// (a bf16 checkpoint quantized on the fly into a temporary directory, with `mxserve quantize`'s own code) and
// turning a text file into token ids with the model's tokenizer.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/args.h"
#include "model/causal_lm.h"

namespace mxserve::cli {

// A model loaded for evaluation; owns the temporary quantized copy, removed on destruction.
struct EvalModel {
  std::unique_ptr<model::CausalLM> model;
  std::string precision;  // "checkpoint" or the --quantization scheme
  std::string temp_dir;
  ~EvalModel();
};

// quantization: "" / "none" (the checkpoint as stored) or a `mxserve quantize` scheme (mxfp4, fp8-block, ...).
// Where an eval model comes from beyond its directory: the KV cache element type (--kv-cache-dtype) and, for
// synthetic weights (dir is then a config.json), the decoder layers kept (0 = all).
struct EvalModelOptions {
  kvcache::KvCacheDtype kv_cache_dtype = kvcache::KvCacheDtype::kAuto;
  bool synthetic = false;
  int64_t num_layers = 0;
};
Result<std::unique_ptr<EvalModel>> load_eval_model(const std::string& dir, const std::string& quantization,
                                                   backend::Backend& be, bool load_mtp,
                                                   const EvalModelOptions& options = {});

// The whole file as one string, encoded without special tokens by the tokenizer in tokenizer_dir; the first
// max_tokens ids (0: all). Every id must be < vocab_size.
Result<std::vector<int32_t>> text_file_ids(const std::string& path, const std::string& tokenizer_dir,
                                           int64_t max_tokens, int64_t vocab_size);

// --kv-cache-dtype auto|bf16|fp8_e4m3|fp8 (default auto).
Result<kvcache::KvCacheDtype> kv_cache_dtype_flag(const Args& args);

int eval_fail(const Status& s, int code = 2);

// "N/M tokens" progress on stderr: one line rewritten with \r on a terminal; piped to a file or a CI log, full
// lines instead, at most one per tenth of the work (and the last), so the log reads line by line.
class ProgressLine {
 public:
  explicit ProgressLine(const char* unit);
  void update(int64_t done, int64_t total);
  void finish();  // ends the terminal line

 private:
  const char* unit_;
  bool tty_;
  bool printed_ = false;
  int64_t last_tenth_ = -1;
};

int eval_acceptance(int argc, char** argv);  // cmd_eval_spec.cpp
int eval_tasks(int argc, char** argv);       // cmd_eval_tasks.cpp

}  // namespace mxserve::cli
