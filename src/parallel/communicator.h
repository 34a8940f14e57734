// Communicator: the collectives one rank runs with the other ranks of its group, on tensors that live on
// the rank's backend (device memory on CUDA). The model calls these at its parallel seams (after a
// column-sharded projection: all_reduce; expert dispatch: all_to_all). Implementations: the single rank
// (every collective is the identity: in-place ops leave x as it is, the others return their input, which
// shares storage) and the CPU thread group (parallel/cpu_communicator.h: N ranks as threads of one
// process over host memory, deterministic rank-order reductions). NCCL implements the same interface
// later; see docs/howto.md "Add a collective" and docs/parallel.md.
// Invariant: shapes are checked on every call (a wrong shape is a Status naming the op and the tensor),
// so code written against the single rank fails the same way it will on many.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "parallel/rank_layout.h"

namespace mxserve::parallel {

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  virtual const RankLayout& layout() const = 0;
  int rank() const { return layout().rank; }
  int size() const { return layout().world(); }

  // x (any shape) in place: every rank ends with the element-wise reduction over all ranks.
  virtual Status all_reduce(Tensor& x, ReduceOp op) = 0;
  // in [R, ...] on every rank -> [size() * R, ...], rank-major.
  virtual Result<Tensor> all_gather(const Tensor& in) = 0;
  // in [size() * R, ...] -> this rank's [R, ...] block of the reduction over ranks.
  virtual Result<Tensor> reduce_scatter(const Tensor& in, ReduceOp op) = 0;
  // in [sum(send_rows), ...], rows grouped by destination rank (send_rows[r] rows to rank r) -> the rows
  // received, grouped by source rank; recv_rows[r] = rows that came from rank r.
  virtual Result<Tensor> all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows,
                                    std::vector<int64_t>* recv_rows) = 0;
  // Variable rows (DP attention's token exchange, docs/parallel.md). The ranks may bring different row
  // counts, 0 included; every rank brings the same dtype and the same dims after the first.
  // all_gather_v: in [R_r, ...] on rank r -> [R_0 + ... + R_{size-1}, ...] on every rank, the ranks' rows
  // concatenated in rank order (rank r's rows at [R_0 + ... + R_{r-1}, ... + R_r)); *rows (when not null)
  // gets {R_0, ..., R_{size-1}}, the same on every rank.
  virtual Result<Tensor> all_gather_v(const Tensor& in, std::vector<int64_t>* rows) = 0;
  // reduce_scatter_v: the inverse of all_gather_v's layout. rows (size() counts >= 0, the same vector on
  // every rank) and in [sum(rows), ...] (the same shape on every rank) -> this rank's [rows[rank()], ...]:
  // rows [rows[0] + ... + rows[rank()-1], + rows[rank()]) of the element-wise reduction of every rank's in.
  virtual Result<Tensor> reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& rows, ReduceOp op) = 0;
  // in [R, C] on every rank -> [R, size() * C]: rank r's columns at [r * C, (r + 1) * C) (vocab-parallel
  // logits gathered into full rows).
  virtual Result<Tensor> all_gather_columns(const Tensor& in) = 0;
  // Every rank of the group waits until all have arrived.
  virtual Status barrier() = 0;
  // This rank failed (`why`): the group is poisoned, so every rank's pending and later collectives return
  // an error naming this rank instead of waiting for it.
  virtual void abort(const Status& why) = 0;
};

// The communicator of a world of one rank (errors when layout.world() != 1).
Result<std::unique_ptr<Communicator>> make_single_rank_communicator(const RankLayout& layout);

}  // namespace mxserve::parallel
