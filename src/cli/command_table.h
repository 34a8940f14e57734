// The one table of `mxserve` commands: name, summary, usage line, flags (with value names and defaults) and an
// example. The top-level usage, `mxserve CMD --help` and `mxserve help CMD` all print from it; Args::parse prints
// a command's entry when it sees --help, so a command's help is reached through its real parser (and the CLI test
// tests/cli/test_cli_help.sh checks the printed flags equal the flags that parser accepts).
#pragma once

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "core/nearest_name.h"

namespace mxserve::cli {

struct FlagHelp {
  std::string flag;     // "--model"; empty: `help` is a section heading
  std::string value;    // "DIR"; empty: a switch that takes no value
  std::string def;      // the default as the user would type it; empty: none / required / computed (see help)
  std::string help;
};

struct CommandHelp {
  std::string name;     // "generate", or "eval perplexity" for a subcommand
  std::string summary;  // one line, shown by `mxserve --help`
  std::string usage;    // the synopsis after "usage: mxserve NAME"
  std::vector<FlagHelp> flags;
  std::string example;  // one or more command lines, each starting with "mxserve"
  std::vector<std::string> subcommands;  // "eval": perplexity, compare, ...; their entries are "eval perplexity" ...
  bool own_help = false;  // the command prints its own --help (bench: its parser lives in src/bench)
};

// Every entry, top-level commands first in the order `mxserve --help` lists them, then subcommands.
const std::vector<CommandHelp>& command_table();
const CommandHelp* find_command_help(const std::string& name);

void print_usage(FILE* out);                           // the top-level command list
void print_command_help(const CommandHelp& c, FILE* out);

// Typo hints (core/nearest_name.h): the flag or command the user probably meant.
using mxserve::edit_distance;
using mxserve::nearest_name;

// The command being run (set by main: "generate", "eval"); Args::parse joins it with its argv[0] to find the entry
// ("eval" + "perplexity" -> "eval perplexity").
void set_current_command(const std::string& name);
const std::string& current_command();

}  // namespace mxserve::cli
