#include "parallel/cpu_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <functional>
#include <mutex>

#include "parallel/recoverable.h"

namespace mxserve::parallel {
namespace {

// What one rank brought to the current collective.
struct Post {
  std::string op;
  const Tensor* in = nullptr;
  const std::vector<int64_t>* send_rows = nullptr;  // all_to_all (send counts), reduce_scatter_v (row counts)
};

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

// The state the ranks of one world share: the posts of the collective in flight, a generation barrier and
// the poison flag.
class CpuGroup {
 public:
  CpuGroup(int n, const CpuGroupOptions& options) : n_(n), options_(options), posts_(n), arrived_(n, false) {}
  int size() const { return n_; }
  Post& post(int rank) { return posts_[rank]; }
  const Post& post(int rank) const { return posts_[rank]; }

  // Waits until every rank has arrived at this barrier. An error when the group is (or becomes) poisoned,
  // or when the wait outlasts the timeout (which poisons it, naming the ranks that never came).
  Status arrive(int rank, const std::string& op) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (poisoned_) return failed(rank, op);
    const uint64_t my_generation = generation_;
    arrived_[rank] = true;
    if (++count_ == n_) {
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      cv_.notify_all();
      return Status::ok();
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (generation_ == my_generation && !poisoned_) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == my_generation && !poisoned_) {
        std::string missing;
        for (int r = 0; r < n_; ++r)
          if (!arrived_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        poison_locked(Status(StatusCode::kUnavailable, "rank " + std::to_string(rank) + " waited " +
                                                           seconds(options_.timeout) + " s at " + op +
                                                           " for rank(s) " + missing + ", which never arrived"));
        lost_ = true;
        return failed(rank, op);
      }
    }
    if (generation_ != my_generation) return Status::ok();
    return failed(rank, op);
  }

  void poison(int rank, const Status& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    poison_locked(Status(why.is_ok() ? StatusCode::kInternal : why.code(),
                         "rank " + std::to_string(rank) + " failed: " + why.message()));
  }

  // parallel/recoverable.h, at a quiet point (no rank inside a collective): the abort and any half-done
  // exchange (ranks counted at a barrier that the failure broke) cleared. A group that lost a rank (a wait
  // timed out) stays failed.
  Status reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poisoned_) return Status::ok();
    if (lost_) return Status(poison_.code(), "the rank group cannot recover (a rank was lost): " + poison_.message());
    poisoned_ = false;
    poison_ = Status();
    count_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), false);
    ++generation_;  // no waiter is left (quiet point): a fresh generation for the next collective
    std::fill(posts_.begin(), posts_.end(), Post{});
    return Status::ok();
  }

 private:
  void poison_locked(Status why) {
    if (!poisoned_) poison_ = std::move(why);  // the first failure is the cause; later ones are its echo
    poisoned_ = true;
    cv_.notify_all();
  }
  Status failed(int rank, const std::string& op) const {
    return Status(poison_.code(), op + " on rank " + std::to_string(rank) + " of " + std::to_string(n_) +
                                      ": the rank group failed (" + poison_.message() + ")");
  }

  const int n_;
  const CpuGroupOptions options_;
  std::vector<Post> posts_;
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int count_ = 0;
  std::vector<bool> arrived_;
  bool poisoned_ = false;
  bool lost_ = false;  // poisoned by a wait timeout: a rank never came (reset() refuses)
  Status poison_;
};

// Bytes of one row (dim 0) of a contiguous tensor; defined for zero rows too.
int64_t row_bytes(const Tensor& t) {
  int64_t n = dtype_bits(t.dtype()) / 8;
  for (int d = 1; d < t.ndim(); ++d) n *= t.dim(d);
  return n;
}

class CpuCommunicator final : public Communicator, public RecoverableGroup {
 public:
  CpuCommunicator(const RankLayout& layout, std::shared_ptr<CpuGroup> group)
      : layout_(layout), group_(std::move(group)) {}
  std::string name() const override { return "cpu-threads x" + std::to_string(group_->size()); }
  const RankLayout& layout() const override { return layout_; }

  Status all_reduce(Tensor& x, ReduceOp op) override {
    MX_RETURN_IF_ERROR(check_input("all_reduce", x, /*f32_only=*/true));
    Tensor result;
    MX_RETURN_IF_ERROR(exchange("all_reduce", &x, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes("all_reduce"));
      result = reduce(0, x.numel(), x.shape(), op);
      return Status::ok();
    }));
    std::memcpy(x.raw(), result.raw(), x.nbytes());  // after the last barrier: no rank reads x any more
    return Status::ok();
  }

  Result<Tensor> all_gather(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check_rows("all_gather", in));
    Tensor out;
    MX_RETURN_IF_ERROR(exchange("all_gather", &in, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes("all_gather"));
      Shape shape = in.shape();
      shape[0] *= size();
      out = Tensor::empty(in.dtype(), shape);
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<char*>(out.raw()) + r * in.nbytes(), input(r).raw(), in.nbytes());
      return Status::ok();
    }));
    return out;
  }

  Result<Tensor> all_gather_v(const Tensor& in, std::vector<int64_t>* rows) override {
    MX_RETURN_IF_ERROR(check_rows("all_gather_v", in));
    Tensor out;
    std::vector<int64_t> counts(size());
    MX_RETURN_IF_ERROR(exchange("all_gather_v", &in, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_row_shapes("all_gather_v"));
      Shape shape = in.shape();
      shape[0] = 0;
      for (int r = 0; r < size(); ++r) shape[0] += counts[r] = input(r).dim(0);
      out = Tensor::empty(in.dtype(), shape);
      int64_t offset = 0;
      for (int r = 0; r < size(); ++r) {
        std::memcpy(static_cast<char*>(out.raw()) + offset, input(r).raw(), input(r).nbytes());
        offset += input(r).nbytes();
      }
      return Status::ok();
    }));
    if (rows != nullptr) *rows = counts;
    return out;
  }

  Result<Tensor> reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& rows, ReduceOp op) override {
    MX_RETURN_IF_ERROR(check_input("reduce_scatter_v", in, true));
    int64_t total = 0;
    bool negative = false;
    for (int64_t n : rows) total += n, negative = negative || n < 0;
    if (in.ndim() < 1 || static_cast<int>(rows.size()) != size() || negative || total != in.dim(0))
      return invalid_argument("reduce_scatter_v: rows must name " + std::to_string(size()) +
                              " rank(s) with non-negative counts summing to the rows of " + in.describe());
    Tensor out;
    MX_RETURN_IF_ERROR(exchange("reduce_scatter_v", &in, &rows, [&] {
      MX_RETURN_IF_ERROR(same_shapes("reduce_scatter_v"));
      for (int r = 0; r < size(); ++r)
        if (*group_->post(r).send_rows != rows)
          return invalid_argument("reduce_scatter_v: rank " + std::to_string(r) + " and rank " +
                                  std::to_string(rank()) +
                                  " bring different row counts (every rank must bring the same)");
      const int64_t row_elems = in.dim(0) == 0 ? 0 : in.numel() / in.dim(0);
      int64_t begin = 0;
      for (int r = 0; r < rank(); ++r) begin += rows[r];
      Shape shape = in.shape();
      shape[0] = rows[rank()];
      out = reduce(begin * row_elems, rows[rank()] * row_elems, shape, op);
      return Status::ok();
    }));
    return out;
  }

  Result<Tensor> all_gather_columns(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check_input("all_gather_columns", in, false));
    if (in.ndim() != 2) return invalid_argument("all_gather_columns: needs a 2-D tensor, got " + in.describe());
    Tensor out;
    MX_RETURN_IF_ERROR(exchange("all_gather_columns", &in, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes("all_gather_columns"));
      const int64_t R = in.dim(0), C = in.dim(1), esize = dtype_bits(in.dtype()) / 8;
      out = Tensor::empty(in.dtype(), {R, size() * C});
      for (int r = 0; r < size(); ++r)
        for (int64_t i = 0; i < R; ++i)
          std::memcpy(static_cast<char*>(out.raw()) + (i * size() * C + r * C) * esize,
                      static_cast<const char*>(input(r).raw()) + i * C * esize, C * esize);
      return Status::ok();
    }));
    return out;
  }

  Result<Tensor> reduce_scatter(const Tensor& in, ReduceOp op) override {
    MX_RETURN_IF_ERROR(check_input("reduce_scatter", in, true));
    if (in.ndim() < 1 || in.dim(0) % size() != 0)
      return invalid_argument("reduce_scatter: " + in.describe() + " does not split into " + std::to_string(size()) +
                              " equal row blocks");
    Tensor out;
    MX_RETURN_IF_ERROR(exchange("reduce_scatter", &in, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes("reduce_scatter"));
      Shape shape = in.shape();
      shape[0] /= size();
      const int64_t block = in.numel() / size();
      out = reduce(rank() * block, block, shape, op);
      return Status::ok();
    }));
    return out;
  }

  Result<Tensor> all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows,
                            std::vector<int64_t>* recv_rows) override {
    MX_RETURN_IF_ERROR(check_rows("all_to_all", in));
    int64_t total = 0;
    bool negative = false;
    for (int64_t n : send_rows) total += n, negative = negative || n < 0;
    if (static_cast<int>(send_rows.size()) != size() || total != in.dim(0) || negative)
      return invalid_argument("all_to_all: send_rows must name " + std::to_string(size()) +
                              " rank(s) with non-negative counts summing to the " + std::to_string(in.dim(0)) +
                              " rows of " + in.describe());
    Tensor out;
    std::vector<int64_t> recv(size());
    MX_RETURN_IF_ERROR(exchange("all_to_all", &in, &send_rows, [&] {
      for (int r = 0; r < size(); ++r) {
        const Tensor& t = input(r);
        if (t.dtype() != in.dtype() || t.ndim() != in.ndim() ||
            !std::equal(t.shape().begin() + 1, t.shape().end(), in.shape().begin() + 1))
          return invalid_argument("all_to_all: rank " + std::to_string(r) + " sent " + t.describe() + ", rank " +
                                  std::to_string(rank()) + " " + in.describe() + " (dtype and row shape must agree)");
        recv[r] = (*group_->post(r).send_rows)[rank()];
      }
      Shape shape = in.shape();
      shape[0] = 0;
      for (int64_t n : recv) shape[0] += n;
      out = Tensor::empty(in.dtype(), shape);
      const int64_t rb = row_bytes(in);
      int64_t dst_row = 0;
      for (int r = 0; r < size(); ++r) {
        const std::vector<int64_t>& rows = *group_->post(r).send_rows;
        int64_t src_row = 0;
        for (int d = 0; d < rank(); ++d) src_row += rows[d];
        std::memcpy(static_cast<char*>(out.raw()) + dst_row * rb,
                    static_cast<const char*>(input(r).raw()) + src_row * rb, recv[r] * rb);
        dst_row += recv[r];
      }
      return Status::ok();
    }));
    if (recv_rows != nullptr) *recv_rows = recv;
    return out;
  }

  Status barrier() override {
    return exchange("barrier", nullptr, nullptr, [] { return Status::ok(); });
  }

  void abort(const Status& why) override { group_->poison(rank(), why); }
  Status reset_after_abort() override { return group_->reset(); }

 private:
  // Post -> barrier -> every rank checks the op and computes its result from all posts -> barrier (inputs
  // stay alive and unmodified until every rank has read them). The compute step's error (a mismatch every
  // rank sees alike) is returned after the second barrier, so no rank is left waiting.
  Status exchange(const std::string& op, const Tensor* in, const std::vector<int64_t>* send_rows,
                  const std::function<Status()>& compute) {
    group_->post(rank()) = Post{op, in, send_rows};
    MX_RETURN_IF_ERROR(group_->arrive(rank(), op));
    Status s = Status::ok();
    for (int r = 0; r < size() && s.is_ok(); ++r)
      if (group_->post(r).op != op)
        s = invalid_argument(op + " on rank " + std::to_string(rank()) + " met " + group_->post(r).op + " on rank " +
                             std::to_string(r) + ": the ranks are out of step");
    if (s.is_ok()) s = compute();
    Status after = group_->arrive(rank(), op);
    return s.is_ok() ? after : s;
  }

  const Tensor& input(int r) const { return *group_->post(r).in; }

  Status same_shapes(const std::string& op) const {
    const Tensor& mine = input(rank());
    for (int r = 0; r < size(); ++r)
      if (input(r).dtype() != mine.dtype() || input(r).shape() != mine.shape())
        return invalid_argument(op + ": rank " + std::to_string(r) + " brought " + input(r).describe() + ", rank " +
                                std::to_string(rank()) + " " + mine.describe() + " (every rank must bring the same)");
    return Status::ok();
  }

  // Same dtype and dims after the first on every rank (row counts may differ).
  Status same_row_shapes(const std::string& op) const {
    const Tensor& mine = input(rank());
    for (int r = 0; r < size(); ++r)
      if (input(r).dtype() != mine.dtype() || input(r).ndim() != mine.ndim() ||
          !std::equal(mine.shape().begin() + 1, mine.shape().end(), input(r).shape().begin() + 1))
        return invalid_argument(op + ": rank " + std::to_string(r) + " brought " + input(r).describe() + ", rank " +
                                std::to_string(rank()) + " " + mine.describe() +
                                " (dtype and row shape must agree; row counts may differ)");
    return Status::ok();
  }

  // Elements [begin, begin + n) reduced over the ranks in rank order, as a new f32 tensor of `shape`.
  Tensor reduce(int64_t begin, int64_t n, const Shape& shape, ReduceOp op) const {
    Tensor out = Tensor::empty(DType::kF32, shape);
    float* o = out.data<float>();
    std::memcpy(o, input(0).data<float>() + begin, n * sizeof(float));
    for (int r = 1; r < size(); ++r) {
      const float* x = input(r).data<float>() + begin;
      if (op == ReduceOp::kSum) {
        for (int64_t i = 0; i < n; ++i) o[i] += x[i];
      } else {
        for (int64_t i = 0; i < n; ++i) o[i] = std::max(o[i], x[i]);
      }
    }
    return out;
  }

  Status check_input(const char* op, const Tensor& t, bool f32_only) const {
    if (!t.defined()) return invalid_argument(std::string(op) + ": undefined tensor");
    if (t.device().type != DeviceType::kCPU)
      return invalid_argument(std::string(op) + ": the CPU communicator needs host tensors, got " + t.describe() +
                              " on " + t.device().to_string());
    if (!t.is_contiguous()) return invalid_argument(std::string(op) + ": needs a contiguous tensor, got " + t.describe());
    if (f32_only && t.dtype() != DType::kF32)
      return unsupported(std::string(op) + ": the CPU communicator reduces f32 only, got " + t.describe());
    return Status::ok();
  }
  Status check_rows(const char* op, const Tensor& t) const {
    MX_RETURN_IF_ERROR(check_input(op, t, false));
    if (t.ndim() < 1) return invalid_argument(std::string(op) + ": needs a tensor with rows, got " + t.describe());
    return Status::ok();
  }

  RankLayout layout_;
  std::shared_ptr<CpuGroup> group_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_cpu_communicators(const std::vector<RankLayout>& layouts,
                                                                          const CpuGroupOptions& options) {
  const int n = static_cast<int>(layouts.size());
  if (n < 1) return invalid_argument("make_cpu_communicators: no ranks");
  for (int r = 0; r < n; ++r)
    if (layouts[r].rank != r || layouts[r].world() != n)
      return invalid_argument("make_cpu_communicators: layout " + std::to_string(r) + " is " + layouts[r].describe() +
                              ", expected rank " + std::to_string(r) + " of a world of " + std::to_string(n));
  if (options.timeout.count() <= 0) return invalid_argument("make_cpu_communicators: the timeout must be positive");
  auto group = std::make_shared<CpuGroup>(n, options);
  std::vector<std::unique_ptr<Communicator>> out;
  for (const RankLayout& l : layouts) out.push_back(std::make_unique<CpuCommunicator>(l, group));
  return out;
}

}  // namespace mxserve::parallel
