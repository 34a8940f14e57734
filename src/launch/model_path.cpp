// check_model_path (see model_path.h): one filesystem look at what the user named, one message that says what it
// is and what to pass instead.
#include "launch/model_path.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <system_error>
#include <vector>

namespace mxserve::launch {
namespace fs = std::filesystem;
namespace {

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// Subdirectories of dir that hold a config.json (checkpoints), sorted, at most `limit`.
std::vector<std::string> checkpoint_subdirs(const fs::path& dir, size_t limit) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_dir(it->path()) && is_file(it->path() / "config.json")) out.push_back(it->path().string());
  std::sort(out.begin(), out.end());
  if (out.size() > limit) out.resize(limit);
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool has_extension(const fs::path& dir, const std::string& ext) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ext) return true;
  return false;
}

}  // namespace

bool looks_like_hub_id(const std::string& path) {
  const size_t slash = path.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= path.size() || path.find('/', slash + 1) != std::string::npos)
    return false;
  if (path[0] == '.' || path[0] == '~') return false;
  for (char c : path)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  return !is_dir(path.substr(0, slash));  // "models/nope" is a local path whose last part is missing
}

Status check_model_path(const std::string& path, const std::string& flag) {
  const std::string given = flag + " " + path;
  if (path.empty()) return invalid_argument(flag + " is empty: pass a checkpoint directory");
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) {
    if (looks_like_hub_id(path)) {
      const std::string local = "models/" + path.substr(path.find('/') + 1);
      return not_found(given + ": no such directory. It looks like a Hugging Face hub id; mxserve does not download "
                       "weights: download them first, e.g. `huggingface-cli download " + path + " --local-dir " + local +
                       "` (or `hf download " + path + " --local-dir " + local + "`), then pass " + flag + " " + local);
    }
    std::string msg = given + ": no such directory";
    const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if (is_dir(parent)) {
      const auto near = checkpoint_subdirs(parent, 6);
      if (!near.empty()) msg += " (checkpoints in " + parent.string() + ": " + join(near) + ")";
    } else {
      msg += " (" + parent.string() + " does not exist either)";
    }
    return not_found(msg);
  }
  if (!is_dir(p)) {
    const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
    if (p.filename() == "config.json")
      return invalid_argument(given + " is the config file, not the checkpoint: pass its directory, " + flag + " " + dir);
    if (p.extension() == ".safetensors" || p.extension() == ".json")
      return invalid_argument(given + " is a file; " + flag + " takes the checkpoint directory (config.json + "
                              "*.safetensors + tokenizer files): pass " + flag + " " + dir);
    return invalid_argument(given + " is a file, not a checkpoint directory (config.json + *.safetensors + "
                            "tokenizer files)");
  }
  if (!is_file(p / "config.json")) {
    std::string msg = given + ": no config.json in this directory (a checkpoint directory holds config.json, "
                      "*.safetensors and the tokenizer files)";
    if (is_dir(p / "snapshots")) {
      const auto snaps = checkpoint_subdirs(p / "snapshots", 1);
      msg += "; it looks like a Hugging Face cache entry: pass " + flag + " " +
             (snaps.empty() ? (p / "snapshots" / "<revision>").string() : snaps.front());
    } else if (const auto sub = checkpoint_subdirs(p, 6); !sub.empty()) {
      msg += "; checkpoints inside it: " + join(sub);
    }
    return invalid_argument(msg);
  }
  if (!is_file(p / "model.safetensors") && !is_file(p / "model.safetensors.index.json")) {
    std::string msg = given + ": config.json but no weights (model.safetensors or model.safetensors.index.json)";
    if (has_extension(p, ".bin")) msg += "; PyTorch .bin weights are not supported: convert them to safetensors";
    else if (has_extension(p, ".gguf")) msg += "; GGUF files are not supported: use the safetensors checkpoint";
    else if (has_extension(p, ".safetensors")) msg += "; *.safetensors shards without model.safetensors.index.json";
    else msg += "; was the download interrupted?";
    return not_found(msg);
  }
  return Status::ok();
}

}  // namespace mxserve::launch
