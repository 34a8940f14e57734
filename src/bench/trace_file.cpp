// Agent trace JSONL parsing and writing (see trace_file.h).
#include "bench/trace_file.h"

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace mxserve::bench {
namespace {

using nlohmann::json;

Status field_error(const std::string& where, const std::string& field, const std::string& why) {
  return invalid_argument(where + ": field '" + field + "' " + why);
}

Result<std::string> session_id(const json& j, const std::string& where) {
  auto it = j.find("session_id");
  if (it == j.end()) return field_error(where, "session_id", "is missing");
  if (it->is_string() && !it->get_ref<const std::string&>().empty()) return it->get<std::string>();
  if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
  return field_error(where, "session_id", "must be a non-empty string or an integer");
}

// One turn object; `where` names the line (and the turn index for a session line).
Result<TraceTurn> parse_turn(const json& j, const std::string& where, bool allow_session_keys) {
  static const std::set<std::string> kKeys = {"input_tokens", "input_text", "output_tokens", "think_time_s", "turn",
                                              "meta"};
  for (const auto& [k, v] : j.items()) {
    if (kKeys.count(k) || (allow_session_keys && k == "session_id")) continue;
    return field_error(where, k, "is not a trace field (input_tokens, input_text, output_tokens, think_time_s, "
                                 "turn, session_id, meta)");
  }
  TraceTurn t;
  const bool has_tokens = j.contains("input_tokens"), has_text = j.contains("input_text");
  if (has_tokens == has_text) return field_error(where, "input_tokens", "or 'input_text': give exactly one");
  if (has_tokens) {
    const json& v = j["input_tokens"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) return field_error(where, "input_tokens", "must be an integer >= 1");
    t.input_tokens = v.get<int64_t>();
  } else {
    const json& v = j["input_text"];
    if (!v.is_string() || v.get_ref<const std::string&>().empty())
      return field_error(where, "input_text", "must be a non-empty string");
    t.input_text = v.get<std::string>();
  }
  auto out = j.find("output_tokens");
  if (out == j.end()) return field_error(where, "output_tokens", "is missing");
  if (!out->is_number_integer() || out->get<int64_t>() < 1) return field_error(where, "output_tokens", "must be an integer >= 1");
  t.output_tokens = out->get<int64_t>();
  if (auto th = j.find("think_time_s"); th != j.end()) {
    if (!th->is_number() || !std::isfinite(th->get<double>()) || th->get<double>() < 0)
      return field_error(where, "think_time_s", "must be a number >= 0 (seconds)");
    t.think_time_s = th->get<double>();
  }
  return t;
}

}  // namespace

int64_t Trace::turns() const {
  int64_t n = 0;
  for (const TraceSession& s : sessions) n += static_cast<int64_t>(s.turns.size());
  return n;
}

bool Trace::needs_tokenizer() const {
  for (const TraceSession& s : sessions)
    for (const TraceTurn& t : s.turns)
      if (t.input_text.empty()) return true;
  return false;
}

Result<Trace> parse_trace_text(const std::string& text, const std::string& what) {
  Trace trace;
  std::map<std::string, size_t> index;          // session id -> position in trace.sessions
  std::set<std::string> whole;                  // ids given as a whole-session line
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = what + ":" + std::to_string(line_no);
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return invalid_argument(where + ": not a JSON object");
    MX_ASSIGN_OR_RETURN(std::string id, session_id(j, where));
    auto [it, fresh] = index.emplace(id, trace.sessions.size());
    if (fresh) trace.sessions.push_back(TraceSession{id, {}});
    TraceSession& s = trace.sessions[it->second];
    if (whole.count(id)) return field_error(where, "session_id", "'" + id + "' was already given as a whole session");
    if (j.contains("turns")) {
      if (!fresh) return field_error(where, "session_id", "'" + id + "' already has turn lines; give it one way");
      for (const auto& [k, v] : j.items())
        if (k != "session_id" && k != "turns" && k != "meta")
          return field_error(where, k, "is not a session field (session_id, turns, meta)");
      const json& turns = j["turns"];
      if (!turns.is_array() || turns.empty()) return field_error(where, "turns", "must be a non-empty array");
      for (size_t k = 0; k < turns.size(); ++k) {
        const std::string tw = where + " turns[" + std::to_string(k) + "]";
        if (!turns[k].is_object()) return invalid_argument(tw + ": not a JSON object");
        MX_ASSIGN_OR_RETURN(TraceTurn t, parse_turn(turns[k], tw, false));
        if (turns[k].contains("turn") && turns[k]["turn"] != json(k))
          return field_error(tw, "turn", "must equal the turn's position " + std::to_string(k));
        s.turns.push_back(std::move(t));
      }
      whole.insert(id);
    } else {
      MX_ASSIGN_OR_RETURN(TraceTurn t, parse_turn(j, where, true));
      if (j.contains("turn") && j["turn"] != json(s.turns.size()))
        return field_error(where, "turn", "must be " + std::to_string(s.turns.size()) + " (turns of session '" + id +
                                              "' come in order from 0)");
      s.turns.push_back(std::move(t));
    }
  }
  if (trace.sessions.empty()) return invalid_argument(what + ": no sessions in the trace");
  return trace;
}

Result<Trace> read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("--trace " + path + ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_trace_text(ss.str(), path);
}

std::string write_trace_text(const Trace& trace) {
  std::string out;
  for (const TraceSession& s : trace.sessions) {
    json turns = json::array();
    for (const TraceTurn& t : s.turns) {
      json o = json::object();
      if (t.input_text.empty()) o["input_tokens"] = t.input_tokens;
      else o["input_text"] = t.input_text;
      o["output_tokens"] = t.output_tokens;
      o["think_time_s"] = t.think_time_s;
      turns.push_back(std::move(o));
    }
    json line = {{"session_id", s.id}, {"turns", std::move(turns)}};
    out += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  return out;
}

}  // namespace mxserve::bench
