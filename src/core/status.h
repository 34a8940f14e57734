// Status / Result: the error type every boundary returns (loaders, parsers, handlers, ops entry).
// Owns: an error code + a human message that names the culprit (file, tensor, field, value).
// Does not own: invariant checks inside the engine (see check.h) -- those abort with file:line.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace mxserve {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad user input: request field, CLI flag, config value
  kNotFound,          // a file, tensor or key that should exist does not
  kDataLoss,          // corrupt or truncated file contents
  kUnsupported,       // valid input we do not implement (named, never silently ignored)
  kOutOfMemory,       // device or host allocation failed
  kInternal,          // a bug or a failed system call
  kUnavailable,       // transient: overloaded, shutting down, retry later
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: <message>"
  std::string to_string() const;
  // Prepends context: "while loading X: <message>".
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status out_of_memory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}          // NOLINT(implicit); must be non-ok
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace mxserve

// Propagate a non-ok Status from an expression returning Status.
#define MX_RETURN_IF_ERROR(expr)                   \
  do {                                             \
    ::mxserve::Status mx_status_ = (expr);         \
    if (!mx_status_.is_ok()) return mx_status_;    \
  } while (0)

#define MX_CONCAT_INNER(a, b) a##b
#define MX_CONCAT(a, b) MX_CONCAT_INNER(a, b)
// MX_ASSIGN_OR_RETURN(auto x, f()) : x = value of f() or return its Status.
#define MX_ASSIGN_OR_RETURN(lhs, ...) MX_ASSIGN_OR_RETURN_N(__COUNTER__, lhs, __VA_ARGS__)
#define MX_ASSIGN_OR_RETURN_N(n, lhs, ...) MX_ASSIGN_OR_RETURN_IMPL(MX_CONCAT(mx_result_, n), lhs, __VA_ARGS__)
#define MX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, ...)  \
  auto tmp = (__VA_ARGS__);                      \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
