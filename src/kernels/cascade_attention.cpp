// Cascade decode attention, host side (kernels/cascade_attention.h): group detection, the saving rule and
// the fixed-capacity encoding the CUDA kernels and the CPU reference read.
#include "kernels/cascade_attention.h"

#include <algorithm>
#include <map>

namespace mxserve::kernels {

CascadeLayout find_cascade_groups(const std::vector<const int32_t*>& tables, const std::vector<int32_t>& n_blocks,
                                  const std::vector<int32_t>& kv_index, int32_t block_size,
                                  const CascadeGroupOptions& options) {
  CascadeLayout out;
  out.n_rows = static_cast<int32_t>(tables.size());
  if (block_size <= 0) return out;
  const int32_t min_members = std::max(1, options.min_members);
  const int32_t max_members = std::max(1, options.max_members);
  // Whole blocks strictly before the row's own key (the block it writes is never shared).
  auto usable = [&](int32_t r) { return std::min(n_blocks[r], std::max(0, kv_index[r]) / block_size); };
  std::map<int32_t, std::vector<int32_t>> by_first;  // first block id -> rows, ascending
  for (int32_t r = 0; r < out.n_rows; ++r)
    if (usable(r) >= options.min_shared_blocks && usable(r) > 0) by_first[tables[r][0]].push_back(r);
  for (auto& [first, rows] : by_first) {
    for (size_t begin = 0; begin < rows.size(); begin += max_members) {
      const size_t end = std::min(rows.size(), begin + static_cast<size_t>(max_members));
      if (static_cast<int32_t>(end - begin) < min_members) continue;
      int32_t k = usable(rows[begin]);
      for (size_t i = begin + 1; i < end; ++i) {
        const int32_t r = rows[i];
        k = std::min(k, usable(r));
        int32_t j = 0;
        while (j < k && tables[r][j] == tables[rows[begin]][j]) ++j;
        k = j;
      }
      if (k < std::max(1, options.min_shared_blocks)) continue;
      CascadeGroup g;
      g.member_begin = static_cast<int32_t>(out.members.size());
      g.n_members = static_cast<int32_t>(end - begin);
      g.shared_blocks = k;
      out.members.insert(out.members.end(), rows.begin() + begin, rows.begin() + end);
      out.groups.push_back(g);
    }
  }
  return out;
}

int64_t cascade_saved_bytes(const CascadeLayout& layout, int32_t block_size, int64_t bytes_per_key) {
  int64_t saved = 0;
  for (const CascadeGroup& g : layout.groups)
    saved += static_cast<int64_t>(g.n_members - 1) * layout.shared_keys(g, block_size) * bytes_per_key;
  return saved;
}

int32_t cascade_work_capacity(int32_t rows, int32_t group_size, int32_t min_members) {
  const int64_t full = (static_cast<int64_t>(rows) * group_size + kCascadeRowsPerItem - 1) / kCascadeRowsPerItem;
  const int64_t groups = rows / std::max(1, min_members) + 1;
  return static_cast<int32_t>(full + groups);
}

bool encode_cascade(const CascadeLayout& layout, int32_t block_size, const CascadeShape& shape, int32_t* out) {
  if (layout.n_rows > shape.cap_rows || static_cast<int32_t>(layout.members.size()) > shape.cap_rows) return false;
  std::fill(out, out + shape.n_ints(), 0);
  int32_t* prefix_keys = out;
  int32_t* members = out + shape.cap_rows;
  int32_t* work = out + 2 * shape.cap_rows;
  std::copy(layout.members.begin(), layout.members.end(), members);
  int32_t n_work = 0;
  for (const CascadeGroup& g : layout.groups) {
    const int64_t keys = layout.shared_keys(g, block_size);
    if (keys > shape.max_prefix_keys) return false;
    for (int32_t i = 0; i < g.n_members; ++i) prefix_keys[layout.members[g.member_begin + i]] = static_cast<int32_t>(keys);
    const int32_t rows = g.n_members * shape.group_size;
    for (int32_t row = 0; row < rows; row += kCascadeRowsPerItem) {
      if (n_work >= shape.cap_work) return false;
      int32_t* w = work + 4 * n_work++;
      w[0] = g.member_begin;
      w[1] = g.n_members;
      w[2] = row;
      w[3] = static_cast<int32_t>(keys);
    }
  }
  return true;
}

}  // namespace mxserve::kernels
