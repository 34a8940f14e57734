#include "runtime/step_log.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <istream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "io/json_fields.h"

namespace mxserve::runtime {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A number as JSON: `fmt` when finite, else null (a NaN would make the line unreadable).
void append_number(std::string& out, const char* key, double v, const char* fmt) {
  char buf[48];
  out += '"';
  out += key;
  out += "\":";
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  std::snprintf(buf, sizeof buf, fmt, v);
  out += buf;
}

Result<double> nonnegative(const io::JsonFields& f, const std::string& key) {
  auto v = f.get_double(key);
  if (!v.is_ok()) return v.status();
  if (!(*v >= 0) || !std::isfinite(*v)) return f.error(key, "a finite number >= 0");
  return *v;
}

Result<int32_t> count(const io::JsonFields& f, const std::string& key) {
  auto v = f.get_int(key);
  if (!v.is_ok()) return v.status();
  if (*v < 0 || *v > INT32_MAX) return f.error(key, "a count in [0, 2^31)");
  return static_cast<int32_t>(*v);
}

Result<StepLogRecord> parse_record(const nlohmann::json& obj, const std::string& source) {
  if (!obj.is_object()) return invalid_argument(source + ": expected a JSON object, found " + obj.dump());
  const io::JsonFields f(obj, source);
  StepLogRecord r;
  MX_ASSIGN_OR_RETURN(r.t, f.get_double("t"));
  MX_ASSIGN_OR_RETURN(r.seconds, f.get_double("s"));
  MX_ASSIGN_OR_RETURN(r.shape.prefill_tokens, nonnegative(f, "pt"));
  MX_ASSIGN_OR_RETURN(r.shape.prefill_pairs, nonnegative(f, "pp"));
  MX_ASSIGN_OR_RETURN(r.shape.decode_rows, nonnegative(f, "dr"));
  MX_ASSIGN_OR_RETURN(r.shape.decode_kv_tokens, nonnegative(f, "dkv"));
  MX_ASSIGN_OR_RETURN(r.prefill_chunks, count(f, "pc"));
  MX_ASSIGN_OR_RETURN(r.decode_seqs, count(f, "ds"));
  MX_ASSIGN_OR_RETURN(const int64_t g, f.get_int("g"));
  if (g != 0 && g != 1) return f.error("g", "0 or 1");
  r.graph = g == 1;
  // "pred" is always written: null when the model was not ready; absent means a truncated or foreign line.
  if (!obj.contains("pred")) return f.error("pred", "a number or null");
  if (!obj.at("pred").is_null()) {
    MX_ASSIGN_OR_RETURN(r.predicted, f.get_double("pred"));
  }
  return r;
}

StepLogClassError summarize(std::vector<double> errors) {
  StepLogClassError e;
  e.n = static_cast<int64_t>(errors.size());
  if (errors.empty()) return e;
  double sum = 0;
  for (double x : errors) sum += x;
  e.mean_rel_error = sum / static_cast<double>(errors.size());
  std::sort(errors.begin(), errors.end());
  const size_t mid = errors.size() / 2;
  e.median_rel_error = errors.size() % 2 ? errors[mid] : (errors[mid - 1] + errors[mid]) / 2;
  return e;
}

}  // namespace

std::string format_step_log_line(const StepLogRecord& r) {
  // Times to 9 significant digits (ns of a second-long step); the features are integer or half-integer
  // counts, which %.17g prints exactly and as short as they are.
  std::string out;
  out.reserve(160);
  out += '{';
  append_number(out, "t", r.t, "%.9g");
  out += ',';
  append_number(out, "s", r.seconds, "%.9g");
  out += ',';
  append_number(out, "pt", r.shape.prefill_tokens, "%.17g");
  out += ',';
  append_number(out, "pp", r.shape.prefill_pairs, "%.17g");
  out += ',';
  append_number(out, "dr", r.shape.decode_rows, "%.17g");
  out += ',';
  append_number(out, "dkv", r.shape.decode_kv_tokens, "%.17g");
  char buf[64];
  std::snprintf(buf, sizeof buf, ",\"pc\":%d,\"ds\":%d,\"g\":%d,", r.prefill_chunks, r.decode_seqs, r.graph ? 1 : 0);
  out += buf;
  append_number(out, "pred", r.predicted, "%.9g");
  out += '}';
  return out;
}

Result<std::vector<StepLogRecord>> parse_step_log(std::istream& in, const std::string& name) {
  std::vector<StepLogRecord> records;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string source = name + ":" + std::to_string(line_no);
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      return invalid_argument(source + ": not a JSON line (" + e.what() + ")");
    }
    MX_ASSIGN_OR_RETURN(StepLogRecord r, parse_record(obj, source));
    records.push_back(r);
  }
  if (in.bad()) return data_loss(name + ": read failed after " + std::to_string(records.size()) + " records");
  return records;
}

Result<std::vector<StepLogRecord>> read_step_log(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open the step log: " + std::strerror(errno));
  return parse_step_log(in, path);
}

Result<std::unique_ptr<StepLogWriter>> StepLogWriter::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return invalid_argument(path + ": cannot create the step log: " + std::strerror(errno));
  return std::unique_ptr<StepLogWriter>(new StepLogWriter(f, path));
}

StepLogWriter::StepLogWriter(std::FILE* file, std::string path)
    : file_(file), path_(std::move(path)), last_flush_(steady_seconds()) {
  buffer_.reserve(64 << 10);
}

StepLogWriter::~StepLogWriter() {
  flush();
  std::fclose(file_);
}

void StepLogWriter::write(const StepLogRecord& r) {
  if (write_failed_) return;
  buffer_ += format_step_log_line(r);
  buffer_ += '\n';
  if (steady_seconds() - last_flush_ >= 1.0) flush();
}

void StepLogWriter::flush() {
  last_flush_ = steady_seconds();
  if (buffer_.empty() || write_failed_) return;
  const bool ok = std::fwrite(buffer_.data(), 1, buffer_.size(), file_) == buffer_.size() && std::fflush(file_) == 0;
  buffer_.clear();
  if (!ok) {  // e.g. the disk filled up: say so once, keep serving, drop the rest of the log
    write_failed_ = true;
    MX_LOG(kError) << "--step-log " << path_ << ": write failed (" << std::strerror(errno)
                   << "); the step log stops here, serving goes on";
  }
}

StepLogReport evaluate_step_log(const std::vector<StepLogRecord>& records, const StepCostOptions& options) {
  enum { kDecodeEager, kDecodeGraph, kWithPrefill, kClasses };
  auto class_of = [](const StepLogRecord& r) {
    return r.shape.prefill_tokens > 0 ? kWithPrefill : r.graph ? kDecodeGraph : kDecodeEager;
  };
  auto timed = [](const StepLogRecord& r) { return std::isfinite(r.seconds) && r.seconds > 0; };
  std::vector<double> online_errors[kClasses], batch_errors[kClasses];

  StepCostModel online(options);
  for (const StepLogRecord& r : records) {
    if (timed(r) && online.ready())
      online_errors[class_of(r)].push_back(std::fabs(r.seconds - online.predict(r.shape)) / r.seconds);
    online.observe(r.shape, r.seconds);
  }

  StepCostOptions all = options;
  all.window = static_cast<int>(
      std::clamp<size_t>(records.size(), static_cast<size_t>(std::max(options.window, 1)), size_t{INT_MAX}));
  all.decay = 1;
  StepCostModel batch(all);
  std::vector<std::pair<StepShape, double>> steps;
  steps.reserve(records.size());
  for (const StepLogRecord& r : records) steps.emplace_back(r.shape, r.seconds);
  batch.observe_all(steps);
  for (const StepLogRecord& r : records)
    if (timed(r)) batch_errors[class_of(r)].push_back(std::fabs(r.seconds - batch.predict(r.shape)) / r.seconds);

  StepLogReport rep;
  rep.records = static_cast<int64_t>(records.size());
  rep.online = online.coefficients();
  rep.batch = batch.coefficients();
  rep.online_decode_eager = summarize(std::move(online_errors[kDecodeEager]));
  rep.online_decode_graph = summarize(std::move(online_errors[kDecodeGraph]));
  rep.online_with_prefill = summarize(std::move(online_errors[kWithPrefill]));
  rep.batch_decode_eager = summarize(std::move(batch_errors[kDecodeEager]));
  rep.batch_decode_graph = summarize(std::move(batch_errors[kDecodeGraph]));
  rep.batch_with_prefill = summarize(std::move(batch_errors[kWithPrefill]));
  return rep;
}

}  // namespace mxserve::runtime
