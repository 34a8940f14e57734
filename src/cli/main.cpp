// mxserve: one binary, one subcommand per job. What each command is and which flags it takes lives in one table
// (cli/command_table.cpp): `mxserve --help`, `mxserve help CMD` and `mxserve CMD --help` all print from it.
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "bench/bench_command.h"
#include "cli/command_table.h"
#include "cli/commands.h"
#include "cli/version.h"

namespace {

namespace cli = mxserve::cli;

struct Dispatch {
  const char* name;
  int (*run)(int, char**);
};

// Every top-level command of the table, and only those (test_cli_help.sh runs `--help` on each).
const Dispatch kCommands[] = {
    {"serve", cli::cmd_serve},
    {"generate", cli::cmd_generate},
    {"verify-fixture", cli::cmd_verify_fixture},
    {"inspect", cli::cmd_inspect},
    {"memory", cli::cmd_memory},
    {"quantize", cli::cmd_quantize},
    {"compare", cli::cmd_compare},
    {"eval", cli::cmd_eval},
    {"tokenize", cli::cmd_tokenize},
    {"detokenize", cli::cmd_detokenize},
    {"render-chat", cli::cmd_render_chat},
    {"parse-output", cli::cmd_parse_output},
    {"bench", mxserve::bench::cmd_bench},
    {"bench-model", cli::cmd_bench_model},
    {"bench-scheduler", cli::cmd_bench_scheduler},
    {"simulate", cli::cmd_simulate},
    {"tune-moe", cli::cmd_tune_moe},
    {"tune-attention", cli::cmd_tune_attention},
    {"bench-grammar", cli::cmd_bench_grammar},
    {"bench-kernels", cli::cmd_bench_kernels},
};

const Dispatch* find(const std::string& name) {
  for (const auto& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

int run(const Dispatch& d, std::vector<char*> args) {
  cli::set_current_command(d.name);
  const int n = static_cast<int>(args.size());
  args.push_back(nullptr);  // argv[argc] is null, as for main
  return d.run(n, args.data());
}

int unknown_command(const std::string& name) {
  std::set<std::string> names;
  for (const auto& c : kCommands) names.insert(c.name);
  names.insert("help");
  const std::string near = cli::nearest_name(name, names);
  std::fprintf(stderr, "mxserve: unknown command '%s' (%s`mxserve --help` lists the commands)\n", name.c_str(),
               near.empty() ? "" : ("did you mean " + near + "? ").c_str());
  return 2;
}

// mxserve help [CMD [SUB]] | help --commands (every command and subcommand, one a line: for the CLI test).
int help(int argc, char** argv) {
  if (argc < 3) {
    cli::print_usage(stdout);
    return 0;
  }
  if (!std::strcmp(argv[2], "--commands")) {
    for (const auto& c : kCommands) {
      std::printf("%s\n", c.name);
      if (const cli::CommandHelp* h = cli::find_command_help(c.name))
        for (const auto& s : h->subcommands) std::printf("%s %s\n", c.name, s.c_str());
    }
    return 0;
  }
  const Dispatch* d = find(argv[2]);
  if (d == nullptr) return unknown_command(argv[2]);
  // Through the command's own parser, so `help CMD` and `CMD --help` cannot differ.
  std::vector<char*> args(argv + 2, argv + argc);
  static char kHelp[] = "--help";
  args.push_back(kHelp);
  return run(*d, args);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    cli::print_usage(stderr);
    return 2;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h") {
    cli::print_usage(stdout);
    return 0;
  }
  if (first == "--version" || first == "-V" || first == "version") {
    std::fputs(cli::version_report().c_str(), stdout);
    return 0;
  }
  if (first == "help") return help(argc, argv);
  if (const Dispatch* d = find(first)) return run(*d, std::vector<char*>(argv + 1, argv + argc));
  if (first.rfind("-", 0) == 0) {
    std::fprintf(stderr, "mxserve: unknown flag %s before the command (`mxserve --help` lists the commands)\n",
                 first.c_str());
    return 2;
  }
  return unknown_command(first);
}
