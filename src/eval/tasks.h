// `mxserve eval tasks`: runs a question-answer dataset against any OpenAI-compatible server and scores it.
// Owns: reading the dataset (JSONL; gsm8k or multiple-choice items), the prompts, answer extraction (the last
// number; the option letter), the 95% Wilson interval, and a concurrent streaming chat client (curl, one
// blocking transfer per worker thread). Does not own: the server. Invariant: every item gets exactly one
// result (a response or an error), in dataset order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::eval {

enum class TaskKind { kGsm8k, kMultipleChoice };
Result<TaskKind> parse_task_kind(const std::string& s);

struct TaskItem {
  std::string id;         // "id" field, else the line number
  std::string prompt;     // the user message sent
  std::string reference;  // gsm8k: the number; multiple choice: the letter
  int n_choices = 0;      // multiple choice only
};

// gsm8k lines: {"question": Q, "answer": "... #### 42"} (or a bare number);
// multiple-choice lines: {"question": Q, "choices" | "options": [..], "answer": "B" | 1}.
// Errors name the file, the line and the field.
Result<std::vector<TaskItem>> load_task_items(const std::string& path, TaskKind kind);

// The answer a response gives: gsm8k the last number (commas dropped, "-3", "2.50" -> "2.5");
// multiple choice "answer is (B)"-style phrases first, else the last standalone option letter in range.
std::optional<std::string> extract_answer(const std::string& response, TaskKind kind, int n_choices);
// Numbers compare by value ("42" == "42.0"); letters exactly.
bool answers_match(const std::string& extracted, const std::string& reference, TaskKind kind);

struct Interval {
  double lo = 0, hi = 0;
};
Interval wilson_interval(int64_t correct, int64_t n, double z = 1.959963984540054);

struct TaskClientOptions {
  std::string base_url;  // http://host:port (no /v1)
  std::string model;
  std::string api_key;
  int concurrency = 8;
  int max_tokens = 512;
  double temperature = 0;
  double timeout_s = 600;
};

struct TaskResult {
  std::string response;
  std::string error;  // transport / HTTP / stream error; empty on success
  double latency_s = 0;
};

// One streaming /v1/chat/completions request per item, `concurrency` at a time; results in item order.
std::vector<TaskResult> run_task_requests(const std::vector<TaskItem>& items, const TaskClientOptions& o,
                                          bool show_progress);

}  // namespace mxserve::eval
