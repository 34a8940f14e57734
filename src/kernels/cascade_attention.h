// Cascade (shared-prefix) decode attention, host side: which plain decode rows share cached prefix blocks,
// whether attending that prefix once per group pays, and the fixed-capacity i32 buffer the kernels read
// (FlashInfer's cascade / Hydragen: the shared prefix is attended once for all of a group's queries, each
// row's own suffix separately, the two (o, lse) merged by the log-sum-exp rule).
// Invariants:
//   - a group's rows have identical physical block ids in their first `shared_blocks` table entries, and
//     shared_blocks * block_size <= kv_index of every member: the shared part is whole blocks strictly before
//     each row's own key (a partially filled last block, or the block the row writes, belongs to the suffix);
//   - only rows [0, n_rows) take part (the batch's leading plain decode rows, one row per sequence);
//   - the encoding has a fixed size for a capacity (rows, work items), so a CUDA graph captured with one
//     buffer replays with any groups written into it: unused work items have n_members 0, rows outside a
//     group have prefix_keys 0 (their suffix is their whole context).
#pragma once

#include <cstdint>
#include <vector>

namespace mxserve::kernels {

// Query rows of one prefix work item (one CUDA block: 4 warps x 16 MMA rows; rows straddle members).
constexpr int32_t kCascadeRowsPerItem = 64;
// Automatic selection (docs/kv-cache.md "Cascade decode attention"): a group needs at least this many
// shared blocks and 2 members, and a batch takes the cascade path when the K/V bytes it saves per layer
// (sum over groups of (members - 1) x shared keys x K+V bytes per key over all kv heads) reach
// kCascadeMinSavedBytes (~7 us of HBM at 4.8 TB/s, above the cost of the extra prefix launch).
constexpr int32_t kCascadeMinSharedBlocks = 4;
constexpr int32_t kCascadeMaxGroup = 64;
constexpr int64_t kCascadeMinSavedBytes = int64_t{32} << 20;

struct CascadeGroup {
  int32_t member_begin = 0;  // first entry of CascadeLayout::members
  int32_t n_members = 0;
  int32_t shared_blocks = 0;
};

// Groups found among rows [0, n_rows): members lists rows group by group (ascending within a group).
struct CascadeLayout {
  int32_t n_rows = 0;
  std::vector<CascadeGroup> groups;
  std::vector<int32_t> members;
  int64_t shared_keys(const CascadeGroup& g, int32_t block_size) const {
    return static_cast<int64_t>(g.shared_blocks) * block_size;
  }
};

struct CascadeGroupOptions {
  int32_t min_shared_blocks = kCascadeMinSharedBlocks;
  int32_t min_members = 2;  // tests use 1 (a group of one row is valid for the kernels)
  int32_t max_members = kCascadeMaxGroup;
};

// Rows [0, n_rows): tables[r] / n_blocks[r] its block table, kv_index[r] its KV index (attends [0, kv_index]).
// Rows with the same first block are candidates; a group takes the longest common run of block ids of its
// members (capped by every member's floor(kv_index / block_size)); candidates split into groups of at most
// max_members in row order. Rows in no group are left out of `members`.
CascadeLayout find_cascade_groups(const std::vector<const int32_t*>& tables, const std::vector<int32_t>& n_blocks,
                                  const std::vector<int32_t>& kv_index, int32_t block_size,
                                  const CascadeGroupOptions& options = {});

// K/V bytes per layer that attending each group's prefix once saves: sum (members - 1) x shared keys x
// bytes_per_key (K + V over all kv heads: 2 x n_kv_heads x head_dim x element bytes, + FP8 scales).
int64_t cascade_saved_bytes(const CascadeLayout& layout, int32_t block_size, int64_t bytes_per_key);

// The device buffer (i32): capacities fixed at allocation (a graph's), the content per step.
//   [0, cap_rows)                   prefix_keys of each row (shared keys; 0 = not in a group)
//   [cap_rows, 2 cap_rows)          members, group by group (row ids)
//   [2 cap_rows, + 4 cap_work)      work items (member_begin, n_members, row_begin, prefix_keys):
//                                   rows [row_begin, row_begin + 64) of the group's n_members x G query rows
struct CascadeShape {
  int32_t cap_rows = 0;
  int32_t cap_work = 0;
  int32_t group_size = 1;        // G = n_heads / n_kv_heads (work items depend on it)
  int32_t max_prefix_keys = 0;   // bound on any prefix_keys (the prefix split plan); graphs: the context class
  int32_t max_suffix_keys = 0;   // bound on any suffix (kv_index + 1 - prefix_keys); 0 = the batch's max_kv_len
  int32_t n_work_hint = 0;       // work items expected (the prefix split plan); 0 = cap_work
  bool empty() const { return cap_rows == 0; }
  int64_t n_ints() const { return 2ll * cap_rows + 4ll * cap_work; }
};

// Work items for `rows` decode rows of group size G at most (every row in groups: ceil(rows G / 64) + the
// groups' partial items, at most rows / 2 + 1 of those with groups of >= 2, rows with groups of 1).
int32_t cascade_work_capacity(int32_t rows, int32_t group_size, int32_t min_members);

// Fills `out` (shape.n_ints() ints) from the layout; false if it does not fit the capacities.
bool encode_cascade(const CascadeLayout& layout, int32_t block_size, const CascadeShape& shape, int32_t* out);

}  // namespace mxserve::kernels
