// CHECK macros for invariants inside the engine: a failure is a bug, so it aborts with file:line and
// the values involved. User input never reaches a CHECK: boundaries validate and return a Status.
#pragma once

#include <sstream>
#include <string>

namespace mxserve {
// Names the calling thread's part in its CHECK failures ("rank 3 of 8 on CUDA device 0": a lockstep rank's worker,
// launch/lockstep_model.cpp), so an abort inside one of several ranks says which; empty (the default): none.
void set_check_context(std::string context);
}  // namespace mxserve

namespace mxserve::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& detail);
}  // namespace mxserve::detail

#define MX_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) ::mxserve::detail::check_failed(__FILE__, __LINE__, #cond, "");    \
  } while (0)

#define MX_CHECK_MSG(cond, msg)                                                     \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::ostringstream mx_os_;                                                    \
      mx_os_ << msg;                                                                \
      ::mxserve::detail::check_failed(__FILE__, __LINE__, #cond, mx_os_.str());     \
    }                                                                               \
  } while (0)

#define MX_CHECK_OP(a, op, b)                                                       \
  do {                                                                              \
    const auto& mx_a_ = (a);                                                        \
    const auto& mx_b_ = (b);                                                        \
    if (!(mx_a_ op mx_b_)) {                                                        \
      std::ostringstream mx_os_;                                                    \
      mx_os_ << mx_a_ << " vs " << mx_b_;                                           \
      ::mxserve::detail::check_failed(__FILE__, __LINE__, #a " " #op " " #b, mx_os_.str()); \
    }                                                                               \
  } while (0)

#define MX_CHECK_EQ(a, b) MX_CHECK_OP(a, ==, b)
#define MX_CHECK_NE(a, b) MX_CHECK_OP(a, !=, b)
#define MX_CHECK_LT(a, b) MX_CHECK_OP(a, <, b)
#define MX_CHECK_LE(a, b) MX_CHECK_OP(a, <=, b)
#define MX_CHECK_GT(a, b) MX_CHECK_OP(a, >, b)
#define MX_CHECK_GE(a, b) MX_CHECK_OP(a, >=, b)
