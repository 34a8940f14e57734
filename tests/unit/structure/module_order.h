// The include-order checker behind test_module_order: src/MODULES declares the modules of src/ as floors
// (one line each, the lowest first); a file in src/<module>/ may #include "<other>/..." only when <other> is
// its own module or sits on a lower floor. Pure std C++: it reads files, it builds nothing.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace mxserve::structure {

struct ModuleOrder {
  std::map<std::string, int> floor;  // module -> floor (1 = the lowest, as docs/architecture.md counts)
  std::vector<std::string> errors;   // malformed lines, modules declared twice
};

// Parses a MODULES text: '#' starts a comment; each non-empty line is one floor of space-separated names.
ModuleOrder parse_module_order(const std::string& text);

struct OrderReport {
  std::vector<std::string> problems;  // each names the file:line, the include and both modules' floors
  int files = 0;                      // source files read
  int includes_checked = 0;           // quoted includes of a declared module
};

// Checks the tree at src_root (holding MODULES and one directory per module): every directory is declared,
// every quoted include of a module (first path component) is the file's own module or one on a lower floor.
// Quoted includes without a module directory (same-directory or external headers) are not checked.
OrderReport check_module_order(const std::filesystem::path& src_root);

}  // namespace mxserve::structure
