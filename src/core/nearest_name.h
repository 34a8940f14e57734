// Typo hints for command lines: the Levenshtein distance between two words, and the candidate nearest to a word
// when it is close enough to be a likely typo (distance <= max(2, |word| / 3)). Used by every CLI parser to name
// the flag or command the user probably meant ("unknown flag --prot (did you mean --port?)").
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace mxserve {

inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// "" when no candidate is close enough.
inline std::string nearest_name(const std::string& word, const std::set<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= std::max<size_t>(2, word.size() / 3) ? best : "";
}

}  // namespace mxserve
