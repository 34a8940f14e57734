// CLI subcommands of the tokenizer module (wired into `mxserve` by the cli module):
//   tokenize     --tokenizer PATH/tokenizer.json [--no-special]     stdin lines -> JSON id arrays
//   detokenize   --tokenizer PATH/tokenizer.json [--skip-special] [--json]
//                                                                   JSON id arrays -> text lines
//   render-chat  --tokenizer-config PATH/tokenizer_config.json | --template FILE.jinja
//                --messages FILE.json [--tools FILE.json] [--add-generation-prompt] [--kwargs JSON]
// argv[0] is the subcommand name. Return value is the process exit code (0 ok, 1 a bad line or
// render error, 2 usage / load error). Errors go to stderr; a bad input line in tokenize prints
// {"error": "..."} on its output line so line alignment is kept.
#pragma once

namespace mxserve::tokenizer {

int cmd_tokenize(int argc, char** argv);
int cmd_detokenize(int argc, char** argv);
int cmd_render_chat(int argc, char** argv);

}  // namespace mxserve::tokenizer
