#include "module_order.h"

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;

namespace mxserve::structure {

ModuleOrder parse_module_order(const std::string& text) {
  ModuleOrder order;
  std::istringstream in(text);
  std::string line;
  int floor = 1, line_no = 0;
  const std::regex name("^[a-z][a-z0-9_]*$");
  while (std::getline(in, line)) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string w;
    bool any = false;
    while (words >> w) {
      any = true;
      if (!std::regex_match(w, name)) {
        order.errors.push_back("MODULES:" + std::to_string(line_no) + ": '" + w + "' is not a module name");
      } else if (!order.floor.emplace(w, floor).second) {
        order.errors.push_back("MODULES:" + std::to_string(line_no) + ": module '" + w + "' is declared twice");
      }
    }
    if (any) ++floor;
  }
  if (order.floor.empty()) order.errors.push_back("MODULES declares no module");
  return order;
}

namespace {

bool is_source(const fs::path& p) {
  static const char* kExt[] = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc"};
  for (const char* e : kExt)
    if (p.extension() == e) return true;
  return false;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

OrderReport check_module_order(const fs::path& src_root) {
  OrderReport report;
  const fs::path modules_file = src_root / "MODULES";
  if (!fs::exists(modules_file)) {
    report.problems.push_back(modules_file.string() + " does not exist");
    return report;
  }
  const ModuleOrder order = parse_module_order(read_file(modules_file));
  for (const std::string& e : order.errors) report.problems.push_back(e);
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(src_root))
    if (entry.is_directory()) dirs.push_back(entry.path().filename().string());
  std::sort(dirs.begin(), dirs.end());
  for (const std::string& d : dirs)
    if (!order.floor.count(d))
      report.problems.push_back("src/" + d + "/ is a directory of src/ but no module of src/MODULES (declare it on "
                                "the floor above everything it includes)");
  const std::regex include_re(R"re(^\s*#\s*include\s*"([^"]+)")re");
  for (const std::string& mod : dirs) {
    const auto own = order.floor.find(mod);
    if (own == order.floor.end()) continue;
    std::vector<fs::path> files;
    for (const auto& entry : fs::recursive_directory_iterator(src_root / mod))
      if (entry.is_regular_file() && is_source(entry.path())) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      ++report.files;
      std::istringstream in(read_file(file));
      std::string line;
      int line_no = 0;
      std::smatch m;
      while (std::getline(in, line)) {
        ++line_no;
        if (!std::regex_search(line, m, include_re)) continue;
        const std::string target = m[1].str();
        const size_t slash = target.find('/');
        if (slash == std::string::npos) continue;  // same-directory header
        const std::string to = target.substr(0, slash);
        const auto it = order.floor.find(to);
        if (it == order.floor.end()) continue;  // not a module (an external header); undeclared dirs named above
        ++report.includes_checked;
        if (to == mod || it->second < own->second) continue;
        const std::string where = "src/" + fs::relative(file, src_root).generic_string() + ":" + std::to_string(line_no);
        report.problems.push_back(
            where + " includes \"" + target + "\": module " + mod + " (floor " + std::to_string(own->second) +
            " of src/MODULES) may include only modules below it, and " + to +
            (it->second == own->second ? " is on the same floor" : " is on floor " + std::to_string(it->second)));
      }
    }
  }
  return report;
}

}  // namespace mxserve::structure
