// Matcher internals shared by matcher.cpp and matcher_closing.cpp: the phase numbers of each frame
// kind and the packing of a bounded number's prefix into a frame. Not part of the module's interface.
#pragma once

#include <cstdint>

#include "structured/matcher.h"
#include "structured/number_bounds.h"

namespace mxserve::structured::phases {

// Container phases (objects and arrays).
enum : uint8_t {
  kOpen = 0,        // expects '{' / '['
  kAfterOpen = 1,   // ws; a key / an item, or the close
  kKey = 2,         // object: inside the key
  kAfterKey = 3,    // object: expects ':'
  kAfterColon = 4,  // object: ws; the value (b = property index while it runs)
  kAfterValue = 5,  // ws; ',' or the close
  kAfterComma = 6,  // ws; a key / an item
};
// Tagged object phases (kTagObject).
enum : uint8_t {
  kTagBetween = 0,  // a key literal of an unwritten property, or the close literal
  kTagKey = 1,      // inside key literal b (c bytes matched)
  kTagValue = 2,    // key b written: its value starts with the next byte
  kTagClose = 3,    // inside the close literal (c bytes matched)
};
// Root frame phases.
enum : uint8_t { kRootValue = 0, kRootDone = 1 };
// Number phases.
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits };

// A bounded number's prefix in a frame: a / b the digits (low / high 32 bits), c packs the counts.
inline bounds::Prefix prefix_of(const Frame& f) {
  bounds::Prefix p;
  p.m = static_cast<uint64_t>(static_cast<uint32_t>(f.a)) | (static_cast<uint64_t>(static_cast<uint32_t>(f.b)) << 32);
  p.int_digits = f.c & 0xFF;
  p.frac_digits = (f.c >> 8) & 0xFF;
  p.neg = (f.c >> 16) & 1;
  p.dot = (f.c >> 17) & 1;
  return p;
}
inline void store_prefix(const bounds::Prefix& p, Frame* f) {
  f->a = static_cast<int32_t>(static_cast<uint32_t>(p.m));
  f->b = static_cast<int32_t>(static_cast<uint32_t>(p.m >> 32));
  f->c = p.int_digits | (p.frac_digits << 8) | (p.neg ? 1 << 16 : 0) | (p.dot ? 1 << 17 : 0);
}


}  // namespace mxserve::structured::phases
