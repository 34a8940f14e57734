// `mxserve tokenize`, `detokenize`, `render-chat`: the tokenizer module's commands (tokenizer/cli_commands.h),
// behind the CLI's own flag parser so they answer --help from the command table and name the nearest flag for a
// typo like every other command. The flag sets here are the ones the tokenizer commands read.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "tokenizer/cli_commands.h"

namespace mxserve::cli {
namespace {

int checked(const char* name, int argc, char** argv, const std::set<std::string>& value_flags,
            const std::set<std::string>& bool_flags, int (*run)(int, char**)) {
  auto args = Args::parse(argc, argv, value_flags, bool_flags);
  if (!args.is_ok()) {
    std::fprintf(stderr, "mxserve %s: %s\n", name, args.status().message().c_str());
    return 2;
  }
  return run(argc, argv);
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  return checked("tokenize", argc, argv, {"--tokenizer"}, {"--no-special"}, tokenizer::cmd_tokenize);
}

int cmd_detokenize(int argc, char** argv) {
  return checked("detokenize", argc, argv, {"--tokenizer"}, {"--skip-special", "--json"}, tokenizer::cmd_detokenize);
}

int cmd_render_chat(int argc, char** argv) {
  return checked("render-chat", argc, argv, {"--tokenizer-config", "--template", "--messages", "--tools", "--kwargs"},
                 {"--add-generation-prompt"}, tokenizer::cmd_render_chat);
}

}  // namespace mxserve::cli
