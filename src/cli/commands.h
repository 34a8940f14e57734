// The `mxserve` subcommands. Each takes (argc, argv) with argv[0] the subcommand name, prints its
// result, and returns the process exit code (0 ok, 1 check failed, 2 bad input).
#pragma once

namespace mxserve::cli {

int cmd_verify_fixture(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_memory(int argc, char** argv);   // cmd_memory.cpp: per-GPU memory and link bytes of a layout
int cmd_quantize(int argc, char** argv);
int cmd_compare(int argc, char** argv);
int cmd_bench_scheduler(int argc, char** argv);
int cmd_simulate(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_tune_moe(int argc, char** argv);       // cmd_moe_kernels.cpp
int cmd_tune_attention(int argc, char** argv); // cmd_tune_attention.cpp
int cmd_bench_kernels(int argc, char** argv);  // cmd_moe_kernels.cpp
int cmd_bench_model(int argc, char** argv);
int cmd_eval(int argc, char** argv);  // cmd_eval.cpp: perplexity, compare, acceptance, tasks
int cmd_parse_output(int argc, char** argv);     // cmd_parse_output.cpp
int cmd_bench_grammar(int argc, char** argv);  // structured output: token-mask cost per step
int cmd_tokenize(int argc, char** argv);       // cmd_text.cpp: the tokenizer module's commands behind cli::Args
int cmd_detokenize(int argc, char** argv);
int cmd_render_chat(int argc, char** argv);

}  // namespace mxserve::cli
