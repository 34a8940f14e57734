// Number bounds (number_bounds.h): interval arithmetic on digit prefixes.
#include "structured/number_bounds.h"

#include <algorithm>
#include <cmath>

namespace mxserve::structured::bounds {
namespace {

using i128 = __int128;

i128 pow10(int k) {
  i128 r = 1;
  for (int i = 0; i < k; ++i) r *= 10;
  return r;
}

i128 floor_div(i128 a, i128 b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0); }

// Integers: [a, b] (signed) holds a multiple of multiple_of inside [int_lo, int_hi].
bool int_meets(const Node& n, i128 a, i128 b) {
  const i128 lo = std::max<i128>(a, n.int_lo), hi = std::min<i128>(b, n.int_hi);
  if (lo > hi) return false;
  const i128 m = n.multiple_of;
  const i128 first = -floor_div(-lo, m) * m;  // ceil(lo / m) * m
  return first <= hi;
}

// Magnitudes [a, b] of some completion with exactly k more digits.
bool int_meets_with(const Node& n, const Prefix& p, int k) {
  const i128 scale = pow10(k);
  const i128 a = static_cast<i128>(p.m) * scale, b = a + scale - 1;
  return p.neg ? int_meets(n, -b, -a) : int_meets(n, a, b);
}

double as_double(bool neg, i128 m, int frac) {
  const long double v = static_cast<long double>(m) / std::pow(10.0L, frac);
  return static_cast<double>(neg ? -v : v);
}

bool in_range(const Node& n, double v) {
  if (n.lo_excl ? !(v > static_cast<double>(n.lo)) : !(v >= static_cast<double>(n.lo))) return false;
  if (n.hi_excl ? !(v < static_cast<double>(n.hi)) : !(v <= static_cast<double>(n.hi))) return false;
  return true;
}

// Numbers: some value in the magnitude interval [a, b) (b exclusive) is in range.
bool num_meets(const Node& n, bool neg, double a, double b) {
  double lo_v, hi_v;
  bool lo_in, hi_in;
  if (!neg) {
    lo_v = a, lo_in = true, hi_v = b, hi_in = false;
  } else {
    lo_v = -b, lo_in = false, hi_v = -a, hi_in = true;
  }
  const double rlo = static_cast<double>(n.lo), rhi = static_cast<double>(n.hi);
  double L, U;
  bool L_in, U_in;
  if (lo_v > rlo) L = lo_v, L_in = lo_in;
  else if (rlo > lo_v) L = rlo, L_in = !n.lo_excl;
  else L = lo_v, L_in = lo_in && !n.lo_excl;
  if (hi_v < rhi) U = hi_v, U_in = hi_in;
  else if (rhi < hi_v) U = rhi, U_in = !n.hi_excl;
  else U = hi_v, U_in = hi_in && !n.hi_excl;
  return L < U || (L == U && L_in && U_in);
}

}  // namespace

bool complete(const Node& n, const Prefix& p) {
  if (p.int_digits == 0 || (p.dot && p.frac_digits == 0)) return false;
  if (n.kind == NodeKind::kInteger) {
    const i128 v = p.neg ? -static_cast<i128>(p.m) : static_cast<i128>(p.m);
    return int_meets(n, v, v);
  }
  return in_range(n, as_double(p.neg, p.m, p.frac_digits));
}

bool feasible(const Node& n, const Prefix& p) {
  if (p.int_digits == 0) return p.neg ? may_be_negative(n) : true;
  const bool leading_zero = p.m == 0 && p.int_digits == 1 && !p.dot;
  if (n.kind == NodeKind::kInteger) {
    if (leading_zero) return int_meets_with(n, p, 0);
    for (int k = 0; p.int_digits + k <= kMaxDigits; ++k)
      if (int_meets_with(n, p, k)) return true;
    return false;
  }
  if (p.dot || leading_zero) {  // [M, M + 1) / 10^f
    const double a = as_double(false, p.m, p.frac_digits), b = as_double(false, static_cast<i128>(p.m) + 1, p.frac_digits);
    if (p.int_digits + p.frac_digits >= kMaxTotalDigits) return complete(n, p);
    return num_meets(n, p.neg, a, b);
  }
  for (int k = 0; p.int_digits + k <= kMaxDigits; ++k) {
    const i128 scale = pow10(k);
    const i128 a = static_cast<i128>(p.m) * scale, b = (static_cast<i128>(p.m) + 1) * scale;
    if (num_meets(n, p.neg, static_cast<double>(a), static_cast<double>(b))) return true;
  }
  return false;
}

int min_more_bytes(const Node& n, const Prefix& p) {
  if (complete(n, p)) return 0;
  if (!feasible(n, p)) return -1;
  // Breadth-first over the next byte: digits (and '.' for numbers); the depth is small (<= 18).
  struct Item {
    Prefix p;
    int cost;
  };
  std::vector<Item> layer{{p, 0}};
  for (int depth = 1; depth <= kMaxTotalDigits + 2 && !layer.empty(); ++depth) {
    std::vector<Item> next;
    for (const Item& it : layer) {
      std::vector<Prefix> cands;
      const bool leading_zero = it.p.m == 0 && it.p.int_digits == 1 && !it.p.dot;
      for (int d = 0; d <= 9; ++d) {
        Prefix q = it.p;
        if (!q.dot) {
          if (leading_zero || q.int_digits >= kMaxDigits) continue;
          q.m = q.m * 10 + static_cast<uint64_t>(d);
          ++q.int_digits;
        } else {
          if (q.int_digits + q.frac_digits >= kMaxTotalDigits) continue;
          q.m = q.m * 10 + static_cast<uint64_t>(d);
          ++q.frac_digits;
        }
        cands.push_back(q);
      }
      if (n.kind == NodeKind::kNumber && !it.p.dot && it.p.int_digits > 0) {
        Prefix q = it.p;
        q.dot = true;
        cands.push_back(q);
      }
      for (const Prefix& q : cands) {
        if (!feasible(n, q)) continue;
        if (complete(n, q)) return depth;
        if (next.size() < 64) next.push_back({q, depth});  // feasible prefixes; a few suffice
      }
    }
    layer = std::move(next);
  }
  return -1;
}

bool may_be_negative(const Node& n) {
  if (n.kind == NodeKind::kInteger) return int_meets(n, -static_cast<i128>(kMaxSafeInteger), -1);
  return num_meets(n, true, 0.0, 1e300) && !(static_cast<double>(n.lo) >= 0.0);
}

bool may_be_nonnegative(const Node& n) {
  if (n.kind == NodeKind::kInteger) return int_meets(n, 0, kMaxSafeInteger);
  return num_meets(n, false, 0.0, 1e300);
}

int min_value_bytes(const Node& n) {
  int best = -1;
  for (bool neg : {false, true}) {
    if (neg ? !may_be_negative(n) : !may_be_nonnegative(n)) continue;
    Prefix p;
    p.neg = neg;
    for (int d = 0; d <= 9; ++d) {
      Prefix q = p;
      q.m = static_cast<uint64_t>(d);
      q.int_digits = 1;
      if (!feasible(n, q)) continue;
      const int more = min_more_bytes(n, q);
      if (more < 0) continue;
      const int total = (neg ? 1 : 0) + 1 + more;
      if (best < 0 || total < best) best = total;
    }
  }
  return best;
}

}  // namespace mxserve::structured::bounds
