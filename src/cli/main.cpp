// mxserve: one binary, one subcommand per job.
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_command.h"
#include "cli/commands.h"
#include "tokenizer/cli_commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"generate", mxserve::cli::cmd_generate, "greedy-decode token ids with a model (--model DIR --ids 1,2,3 | --prompt-len L; --batch B; --runs b=,n=,a=,adaptive=,p=,k=,m=;...; speculation: --speculative-algorithm mtp --speculative-num-steps N [--speculative-eagle-topk K --speculative-num-draft-tokens M]; CUDA graphs for decode steps are on by default on --backend cuda; --disable-cuda-graph / --enforce-eager turn them off)"},
    {"verify-fixture", mxserve::cli::cmd_verify_fixture, "check a model against a golden fixture directory"},
    {"inspect", mxserve::cli::cmd_inspect, "list a checkpoint's tensors and its per-layer precision map"},
    {"quantize", mxserve::cli::cmd_quantize,
     "bf16 checkpoint -> MXFP4 (Quark) or FP8 (--in DIR --out DIR --scheme mxfp4|fp8-block|fp8-channel|fp8-tensor)"},
    {"compare", mxserve::cli::cmd_compare,
     "KL, top-1 agreement, logit cosine and perplexity of two models (--model A --model B --prompts FILE)"},
    {"eval", mxserve::cli::cmd_eval,
     "model quality on real text: eval perplexity | compare | acceptance (MTP) | tasks (accuracy of any server)"},
    {"tokenize", mxserve::tokenizer::cmd_tokenize, "text lines on stdin -> token ids (--tokenizer PATH/tokenizer.json)"},
    {"detokenize", mxserve::tokenizer::cmd_detokenize, "JSON id arrays on stdin -> text (--tokenizer PATH)"},
    {"render-chat", mxserve::tokenizer::cmd_render_chat, "render a chat template (--tokenizer-config FILE --messages FILE)"},
    {"parse-output", mxserve::cli::cmd_parse_output,
     "parse model output text with the chat output parsers (--parser glm45|glm47 [--tools FILE] [--chunk-size N] FILE)"},
    {"serve", mxserve::cli::cmd_serve, "OpenAI-compatible HTTP server (--model DIR | --config FILE --synthetic-weights)"},
    {"bench", mxserve::bench::cmd_bench, "load-test an OpenAI-compatible server (RPS sweep, TTFT knee, cost)"},
    {"bench-model", mxserve::cli::cmd_bench_model,
     "time one attention and one MoE layer + the decode step on a backend (--config FILE --synthetic-weights)"},
    {"bench-scheduler", mxserve::cli::cmd_bench_scheduler, "time the scheduler + KV bookkeeping per step (no model)"},
    {"tune-moe", mxserve::cli::cmd_tune_moe, "tune the MXFP4 MoE kernel choice per token count, write a table (CUDA)"},
    {"tune-attention", mxserve::cli::cmd_tune_attention,
     "tune the decode attention split count per (rows, context), write a table (CUDA)"},
    {"bench-grammar", mxserve::cli::cmd_bench_grammar,
     "structured output: token-mask cost per step at a batch (--tokenizer DIR [--batch 64 --schema F --doc F])"},
    {"bench-kernels", mxserve::cli::cmd_bench_kernels, "MoE kernel microbenchmark: bench-kernels moe --experts E ... (CUDA)"},
};

void usage(FILE* out) {
  std::fprintf(out, "usage: mxserve <command> [flags]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-16s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands)
    if (std::string(argv[1]) == c.name) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "mxserve: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
