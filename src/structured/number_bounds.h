// Number bounds: the digit automaton of a bounded JSON integer / number, as arithmetic on the prefix
// written so far. A prefix is (sign, digits as an integer M, integer digits, fraction digits); a digit is
// allowed only when some completion of the new prefix is in range (and a multiple of multipleOf), so the
// model can never write an out-of-range value and never reaches a prefix it cannot complete.
// Comparisons of non-integers happen in double, as a JSON parser on the client reads the value.
#pragma once

#include <cstdint>

#include "structured/grammar.h"

namespace mxserve::structured::bounds {

constexpr int kMaxDigits = 16;      // integer digits: 2^53 - 1 has 16
constexpr int kMaxTotalDigits = 18;  // integer + fraction digits of a bounded number (M fits int64)

struct Prefix {
  bool neg = false;
  uint64_t m = 0;      // the digits so far as one integer
  int int_digits = 0;  // 0: no digit yet
  int frac_digits = 0;
  bool dot = false;    // a '.' was written
};

// Some completion of p (zero or more digits, for numbers also a fraction) is a valid value.
bool feasible(const Node& n, const Prefix& p);
// The prefix as written is a complete valid value.
bool complete(const Node& n, const Prefix& p);
// The fewest more bytes that make p a complete valid value; -1 when none.
int min_more_bytes(const Node& n, const Prefix& p);
// The fewest bytes of a valid value from scratch ('-' included); -1 when none.
int min_value_bytes(const Node& n);
// '-' may start a value / a digit may start a value (for first-byte sets).
bool may_be_negative(const Node& n);
bool may_be_nonnegative(const Node& n);

}  // namespace mxserve::structured::bounds
