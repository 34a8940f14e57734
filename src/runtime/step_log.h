// The step log (`mxserve serve --step-log FILE`): one JSON line per engine step with what the step cost model
// saw -- its shape, its measured time, whether it replayed a CUDA graph, and the prediction the model made for it
// before observing it -- and the offline evaluation of that model on such a log (`mxserve simulate
// --fit-step-log FILE`). It exists to find out why the online fit errs on real runs (docs/scheduling.md
// "Recording the steps"). It owns the line format, its parser, the buffered writer and the evaluation; the
// engine decides what goes into a record (engine.cpp). Key invariant: format_step_log_line -> parse_step_log is
// a round trip (features exact, times to 9 significant digits, a NaN prediction as null).
#pragma once

#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/step_cost_model.h"

namespace mxserve::runtime {

struct StepLogRecord {
  double t = 0;        // s since the log's first step began
  double seconds = 0;  // measured: what the engine fed the cost model
  StepShape shape;
  int32_t prefill_chunks = 0;
  int32_t decode_seqs = 0;  // chunks that compute one real token (StepShape::add_chunk's decodes)
  bool graph = false;       // the step replayed a CUDA graph
  // The model's prediction made before this step was observed; NaN when the model was not ready.
  double predicted = std::numeric_limits<double>::quiet_NaN();
};

// {"t":..,"s":..,"pt":..,"pp":..,"dr":..,"dkv":..,"pc":..,"ds":..,"g":0|1,"pred":..|null}, no newline.
std::string format_step_log_line(const StepLogRecord& r);
// Every record of a log; blank lines are skipped. Errors: invalid_argument("NAME:LINE: ...") naming the key.
Result<std::vector<StepLogRecord>> parse_step_log(std::istream& in, const std::string& name);
// parse_step_log of a file; a file that cannot be opened is not_found naming it.
Result<std::vector<StepLogRecord>> read_step_log(const std::string& path);

// Appends records to a file, buffered: written out at most once a second and in the destructor (a step is
// ~100 bytes; at hundreds of steps a second one write a second keeps it off the engine thread's time).
// Thread-compatible: only the engine thread writes.
class StepLogWriter {
 public:
  // Creates (truncates) the file; the error names the path and the system's reason.
  static Result<std::unique_ptr<StepLogWriter>> open(const std::string& path);
  ~StepLogWriter();
  StepLogWriter(const StepLogWriter&) = delete;
  StepLogWriter& operator=(const StepLogWriter&) = delete;

  void write(const StepLogRecord& r);
  void flush();  // what is buffered, now
  const std::string& path() const { return path_; }

 private:
  StepLogWriter(std::FILE* file, std::string path);

  std::FILE* file_;
  std::string path_;
  std::string buffer_;
  double last_flush_ = 0;      // steady-clock seconds
  bool write_failed_ = false;  // reported once; later records are dropped
};

struct StepLogClassError {  // |seconds - predicted| / seconds over the records of one class
  int64_t n = 0;
  double mean_rel_error = 0, median_rel_error = 0;
};

struct StepLogReport {
  int64_t records = 0;
  // After replaying every record through StepCostModel::observe in order, as the engine does.
  StepCostCoefficients online;
  // One fit over all records: the same options with a window of at least every record and decay 1.
  StepCostCoefficients batch;
  // Classes: decode-only steps (prefill_tokens == 0), eager or graph-replayed, and steps with prefill. Online:
  // each record predicted by the replayed model before it observed that record, once ready() (what the
  // scheduler saw). Batch: every record predicted by the batch coefficients.
  StepLogClassError online_decode_eager, online_decode_graph, online_with_prefill;
  StepLogClassError batch_decode_eager, batch_decode_graph, batch_with_prefill;
};

// Records with a non-positive or non-finite time are left out of the errors (the model ignores them too).
StepLogReport evaluate_step_log(const std::vector<StepLogRecord>& records, const StepCostOptions& options = {});

}  // namespace mxserve::runtime
