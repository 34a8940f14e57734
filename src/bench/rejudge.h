// `mxserve bench judge FILE.json`: the knee rule (bench/knee.h) applied again to a finished run's saved
// per-request records (`--save-requests`), under the SLO given now: a run judged by an older rule, or a
// different TTFT target, without running it again. Prints one row a point and the knee of its rates in
// ascending order (the grid rule: the highest rate before the first failure).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "bench/request_record.h"
#include "core/status.h"

namespace mxserve::bench {

// The inverse of report.h's requests_to_json (the times and counts the metrics read; no ITL gaps).
// Errors name the record and the field.
Result<std::vector<RequestRecord>> records_from_json(const nlohmann::json& requests);

int cmd_bench_judge(int argc, char** argv);

}  // namespace mxserve::bench
