// mxserve_tokenizer_cli: test-only dispatcher for the tokenizer CLI subcommands (the real
// `mxserve` binary wires the same functions). Usage: mxserve_tokenizer_cli SUBCOMMAND [args...]
#include <cstdio>
#include <cstring>

#include "tokenizer/cli_commands.h"

int main(int argc, char** argv) {
  if (argc >= 2) {
    if (std::strcmp(argv[1], "tokenize") == 0) return mxserve::tokenizer::cmd_tokenize(argc - 1, argv + 1);
    if (std::strcmp(argv[1], "detokenize") == 0) return mxserve::tokenizer::cmd_detokenize(argc - 1, argv + 1);
    if (std::strcmp(argv[1], "render-chat") == 0) return mxserve::tokenizer::cmd_render_chat(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "usage: mxserve_tokenizer_cli tokenize|detokenize|render-chat [args]\n");
  return 2;
}
