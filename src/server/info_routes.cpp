#include "server/info_routes.h"

#include <cctype>
#include <string>

#include "server/completion_handlers.h"
#include "server/json_util.h"

namespace mxserve::server {

nlohmann::ordered_json model_object(const ServerContext& ctx) {
  nlohmann::ordered_json m;
  m["id"] = ctx.options.served_model_name;
  m["object"] = "model";
  m["created"] = ctx.created_unix;
  m["owned_by"] = "mxserve";
  m["root"] = ctx.options.model_root.empty() ? ctx.options.served_model_name : ctx.options.model_root;
  m["parent"] = nullptr;
  m["max_model_len"] = ctx.ready ? ctx.model.max_model_len : 0;
  m["permission"] = nlohmann::ordered_json::array();
  return m;
}

void handle_models(const ServerContext& ctx, http::Response& res) {
  nlohmann::ordered_json j;
  j["object"] = "list";
  j["data"] = nlohmann::ordered_json::array({model_object(ctx)});
  res.set_content(dump_json(j), "application/json");
}

// Percent-decodes a path segment ("org%2Fname" -> "org/name"); malformed escapes are kept as written.
static std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) && hex(s[i + 2])) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

void handle_model_by_id(ServerContext& ctx, const std::string& path, http::Response& res) {
  // Model ids may contain '/' (e.g. "zai-org/GLM-4.5-Air"): everything after the prefix is the id.
  const std::string id = percent_decode(path.substr(std::string("/v1/models/").size()));
  if (id != ctx.options.served_model_name) return write_error(ctx, model_not_found(id.substr(0, 256)), res);
  res.set_content(dump_json(model_object(ctx)), "application/json");
}

void handle_version(const ServerContext& ctx, http::Response& res) {
  nlohmann::ordered_json j;
  j["version"] = ctx.options.version;
  if (!ctx.options.commit.empty()) j["commit"] = ctx.options.commit;
  res.set_content(dump_json(j), "application/json");
}

}  // namespace mxserve::server
