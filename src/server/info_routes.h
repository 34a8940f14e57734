// The small GET routes vLLM / sglang users call besides generation: GET /v1/models (the list), GET
// /v1/models/{id} (one model object, or a 404 in OpenAI's error shape), GET /version. Pure functions of the
// context: they run inline on the event loop.
#pragma once

#include <string>

#include "server/http/message.h"
#include "server/server_context.h"

namespace mxserve::server {

// The model object of /v1/models (id = --served-model-name).
nlohmann::ordered_json model_object(const ServerContext& ctx);
void handle_models(const ServerContext& ctx, http::Response& res);
// path starts with "/v1/models/": the id after it must be the served model name.
void handle_model_by_id(ServerContext& ctx, const std::string& path, http::Response& res);
// {"version": ..., "commit": ...} (ServerOptions::version / ::commit).
void handle_version(const ServerContext& ctx, http::Response& res);

}  // namespace mxserve::server
