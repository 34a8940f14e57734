#include "parallel/device_group_communicator.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>

#include "core/device_oom.h"
#include "core/numeric.h"
#include "parallel/recoverable.h"

namespace mxserve::parallel {
namespace {

using Mark = RankDeviceOps::Mark;

// What one rank brought to the current collective.
struct Post {
  std::string op;
  const Tensor* in = nullptr;
  const std::vector<int64_t>* rows = nullptr;  // all_to_all: send counts; reduce_scatter_v: row counts
};

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

int64_t row_bytes(const Tensor& t) {
  int64_t n = dtype_bits(t.dtype()) / 8;
  for (int d = 1; d < t.ndim(); ++d) n *= t.dim(d);
  return n;
}

const char* at(const Tensor& t, int64_t byte_offset) { return static_cast<const char*>(t.raw()) + byte_offset; }
char* at(Tensor& t, int64_t byte_offset) { return static_cast<char*>(t.raw()) + byte_offset; }

// The state the ranks share: every rank's device side, the posts of the collective in flight, a generation
// barrier and the poison flag.
class DeviceGroup {
 public:
  DeviceGroup(std::vector<std::unique_ptr<RankDeviceOps>> ops, const DeviceGroupOptions& options)
      : n_(static_cast<int>(ops.size())), options_(options), ops_(std::move(ops)), posts_(n_), arrived_(n_, false) {}
  int size() const { return n_; }
  const DeviceGroupOptions& options() const { return options_; }
  RankDeviceOps& ops(int rank) { return *ops_[rank]; }
  Post& post(int rank) { return posts_[rank]; }

  // Waits until every rank has arrived. An error when the group is (or becomes) poisoned, or when the wait
  // outlasts the timeout (which poisons it, naming the ranks that never came).
  // exit: the barrier that ends a collective, which every rank that passed its first barrier reaches (no
  // waits in between); it waits for all of them even in a poisoned group, since until then another rank may
  // still read this rank's post (its input), and only then reports the poison.
  Status arrive(int rank, const std::string& op, bool exit = false) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (poisoned_ && !exit) return failed_locked(rank, op);
    const uint64_t my_generation = generation_;
    arrived_[rank] = true;
    if (++count_ == n_) {
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      cv_.notify_all();
      return exit && poisoned_ ? failed_locked(rank, op) : Status::ok();
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (generation_ == my_generation && (exit || !poisoned_)) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == my_generation) {
        if (poisoned_) break;  // an exit barrier of a poisoned group that outlasted the timeout
        std::string missing;
        for (int r = 0; r < n_; ++r)
          if (!arrived_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        poison_locked(Status(StatusCode::kUnavailable, "rank " + std::to_string(rank) + " waited " +
                                                           seconds(options_.timeout) + " s at " + op +
                                                           " for rank(s) " + missing + ", which never arrived"));
        lost_ = true;
      }
    }
    // Passed (every rank arrived): a first barrier succeeds even if the group was poisoned since, so that every
    // rank goes on to the exit barrier, which reports it.
    if (generation_ != my_generation) return exit && poisoned_ ? failed_locked(rank, op) : Status::ok();
    return failed_locked(rank, op);
  }

  void poison(int rank, const Status& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    poison_locked(Status(why.is_ok() ? StatusCode::kInternal : why.code(),
                         "rank " + std::to_string(rank) + " failed: " + why.message()));
  }
  Status failed(int rank, const std::string& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_locked(rank, op);
  }
  bool poisoned() {
    std::lock_guard<std::mutex> lock(mutex_);
    return poisoned_;
  }
  // parallel/recoverable.h, at a quiet point (no rank inside a collective, every rank's stream synchronized
  // by the caller): the abort and any half-done exchange cleared. A group that lost a rank stays failed.
  Status reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poisoned_) return Status::ok();
    if (lost_) return Status(poison_.code(), "the rank group cannot recover (a rank was lost): " + poison_.message());
    poisoned_ = false;
    poison_ = Status();
    count_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), false);
    ++generation_;
    std::fill(posts_.begin(), posts_.end(), Post{});
    return Status::ok();
  }

 private:
  void poison_locked(Status why) {
    if (!poisoned_) poison_ = std::move(why);  // the first failure is the cause; later ones are its echo
    poisoned_ = true;
    cv_.notify_all();
  }
  Status failed_locked(int rank, const std::string& op) const {
    return Status(poison_.code(), op + " on rank " + std::to_string(rank) + " of " + std::to_string(n_) +
                                      ": the rank group failed (" + poison_.message() + ")");
  }

  const int n_;
  const DeviceGroupOptions options_;
  std::vector<std::unique_ptr<RankDeviceOps>> ops_;
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

bool reducible(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

class DeviceGroupCommunicator final : public Communicator, public FusedReduceAddNorm, public RecoverableGroup {
 public:
  DeviceGroupCommunicator(const RankLayout& layout, std::shared_ptr<DeviceGroup> group)
      : layout_(layout), group_(std::move(group)), ops_(group_->ops(layout.rank)) {}
  std::string name() const override { return group_->options().name + " x" + std::to_string(group_->size()); }
  const RankLayout& layout() const override { return layout_; }

  Status all_reduce(Tensor& x, ReduceOp op) override {
    MX_RETURN_IF_ERROR(check_input("all_reduce", x, /*reduction=*/true));
    Tensor result;
    MX_RETURN_IF_ERROR(exchange("all_reduce", &x, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes("all_reduce"));
      result = ops_.alloc(x.dtype(), x.shape());
      return reduce(result, 0, x.numel(), op);
    }));
    // After every rank's reads of x are done (exchange's last wait): the result goes back in place.
    if (x.nbytes() > 0) MX_RETURN_IF_ERROR(device("all_reduce", ops_.copy(x.raw(), result.raw(), x.nbytes())));
    return Status::ok();
  }

  Result<Tensor> all_gather(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check_rows("all_gather", in));
    Tensor out;
    MX_RETURN_IF_ERROR(exchange("all_gather", &in, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes("all_gather"));
      Shape shape = in.shape();
      shape[0] *= size();
      out = ops_.alloc(in.dtype(), shape);
      for (int r = 0; r < size(); ++r) MX_RETURN_IF_ERROR(copy(at(out, r * in.nbytes()), input(r).raw(), in.nbytes()));
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
      out = ops_.alloc(in.dtype(), shape);
      int64_t offset = 0;
      for (int r = 0; r < size(); ++r) {
        MX_RETURN_IF_ERROR(copy(at(out, offset), input(r).raw(), input(r).nbytes()));
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
        if (*group_->post(r).rows != rows)
          return invalid_argument("reduce_scatter_v: rank " + std::to_string(r) + " and rank " +
                                  std::to_string(rank()) +
                                  " bring different row counts (every rank must bring the same)");
      const int64_t row_elems = in.dim(0) == 0 ? 0 : in.numel() / in.dim(0);
      int64_t begin = 0;
      for (int r = 0; r < rank(); ++r) begin += rows[r];
      Shape shape = in.shape();
      shape[0] = rows[rank()];
      out = ops_.alloc(in.dtype(), shape);
      return reduce(out, begin * row_elems, rows[rank()] * row_elems, op);
    }));
    return out;
  }

  Result<Tensor> all_gather_columns(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check_input("all_gather_columns", in, false));
    if (in.ndim() != 2) return invalid_argument("all_gather_columns: needs a 2-D tensor, got " + in.describe());
    Tensor out;
    MX_RETURN_IF_ERROR(exchange("all_gather_columns", &in, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes("all_gather_columns"));
      const int64_t R = in.dim(0), C = in.dim(1), es = dtype_bits(in.dtype()) / 8;
      out = ops_.alloc(in.dtype(), {R, size() * C});
      if (R * C == 0) return Status::ok();
      for (int r = 0; r < size(); ++r)
        MX_RETURN_IF_ERROR(device("all_gather_columns",
                                  ops_.copy_2d(at(out, r * C * es), size() * C * es, input(r).raw(), C * es, C * es, R)));
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
      out = ops_.alloc(in.dtype(), shape);
      return reduce(out, rank() * block, block, op);
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
        recv[r] = (*group_->post(r).rows)[rank()];
      }
      Shape shape = in.shape();
      shape[0] = 0;
      for (int64_t n : recv) shape[0] += n;
      out = ops_.alloc(in.dtype(), shape);
      const int64_t rb = row_bytes(in);
      int64_t dst_row = 0;
      for (int r = 0; r < size(); ++r) {
        const std::vector<int64_t>& rows = *group_->post(r).rows;
        int64_t src_row = 0;
        for (int d = 0; d < rank(); ++d) src_row += rows[d];
        MX_RETURN_IF_ERROR(copy(at(out, dst_row * rb), at(input(r), src_row * rb), recv[r] * rb));
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

  // The protocol's barriers and events order it: every rank's x is complete before any rank's kernel reads it
  // ("input ready"), and no rank overwrites or frees its x before every rank's kernel has read it ("reads
  // done"). residual and out are this rank's own, written only by its own kernel.
  Status all_reduce_add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps,
                                Tensor& out) override {
    const char* op = "all_reduce_add_rmsnorm";
    MX_RETURN_IF_ERROR(check_input(op, x, /*reduction=*/true));
    MX_RETURN_IF_ERROR(check_input(op, residual, true));
    MX_RETURN_IF_ERROR(check_input(op, weight, true));
    MX_RETURN_IF_ERROR(check_input(op, out, true));
    if (x.ndim() != 2 || residual.shape() != x.shape() || out.shape() != x.shape() || weight.ndim() != 1 ||
        weight.dim(0) != x.dim(1) || residual.dtype() != x.dtype() || out.dtype() != x.dtype() ||
        weight.dtype() != x.dtype())
      return invalid_argument(std::string(op) + ": x " + x.describe() + ", residual " + residual.describe() +
                              ", out " + out.describe() + " must be the same [R, C] and weight " + weight.describe() +
                              " [C], one dtype");
    if (x.numel() > 0 && (out.raw() == residual.raw() || out.raw() == x.raw() || residual.raw() == x.raw()))
      return invalid_argument(std::string(op) + ": out, residual and x must be three distinct tensors");
    return exchange(op, &x, nullptr, [&] {
      MX_RETURN_IF_ERROR(same_shapes(op));
      if (x.numel() == 0) return Status::ok();
      std::vector<const void*> srcs;
      for (int r = 0; r < size(); ++r) srcs.push_back(input(r).raw());
      return device(op, ops_.reduce_add_rmsnorm(srcs, residual.raw(), weight.raw(), out.raw(), x.dim(0), x.dim(1),
                                                eps, x.dtype()));
    });
  }

  void abort(const Status& why) override { group_->poison(rank(), why); }
  Status reset_after_abort() override { return group_->reset(); }

 private:
  // The protocol of the header comment. A check error (the same on every rank) is returned after barrier 2,
  // so no rank is left waiting; a device error poisons the group (device()).
  Status exchange(const std::string& op, const Tensor* in, const std::vector<int64_t>* rows,
                  const std::function<Status()>& compute) {
    if (group_->poisoned()) return group_->failed(rank(), op);
    group_->post(rank()) = Post{op, in, rows};
    MX_RETURN_IF_ERROR(device(op, ops_.record(Mark::kInputReady)));
    MX_RETURN_IF_ERROR(group_->arrive(rank(), op));
    Status s = Status::ok();
    for (int r = 0; r < size() && s.is_ok(); ++r)
      if (group_->post(r).op != op)
        s = invalid_argument(op + " on rank " + std::to_string(rank()) + " met " + group_->post(r).op + " on rank " +
                             std::to_string(r) + ": the ranks are out of step");
    for (int r = 0; r < size() && s.is_ok(); ++r)
      if (r != rank()) s = device(op, ops_.wait_for(group_->ops(r), Mark::kInputReady));
    if (s.is_ok()) {
      // The compute step allocates this rank's output (a DP-attention gather holds every group's rows): a full
      // device must still bring this rank to the exit barrier, which the others wait for even when poisoned.
      try {
        s = compute();
      } catch (const DeviceOutOfMemory& oom) {
        s = out_of_memory(oom.what());
        group_->poison(rank(), s.with_context(op + " on " + layout_.describe()));
      }
    }
    const Status recorded = device(op, ops_.record(Mark::kReadsDone));
    if (s.is_ok()) s = recorded;
    const Status passed = group_->arrive(rank(), op, /*exit=*/true);
    // Every rank has recorded its mark by now (poisoned or not): a later write or free of this rank's input
    // is ordered after every read of it.
    for (int r = 0; r < size(); ++r)
      if (r != rank()) {
        const Status w = device(op, ops_.wait_for(group_->ops(r), Mark::kReadsDone));
        if (s.is_ok()) s = w;
      }
    return s.is_ok() ? passed : s;
  }

  // A failed device call poisons the group (the other ranks must not wait for this one).
  Status device(const std::string& op, Status s) {
    if (s.is_ok()) return s;
    group_->poison(rank(), s.with_context(op + " on " + layout_.describe()));
    return group_->failed(rank(), op);
  }
  Status copy(void* dst, const void* src, int64_t bytes) {
    if (bytes == 0) return Status::ok();
    return device(group_->post(rank()).op, ops_.copy(dst, src, bytes));
  }
  // out[0, n) = rank-order reduction of every rank's input elements [begin, begin + n).
  Status reduce(Tensor& out, int64_t begin, int64_t n, ReduceOp op) {
    if (n == 0) return Status::ok();
    const int64_t es = dtype_bits(out.dtype()) / 8;
    std::vector<const void*> srcs;
    for (int r = 0; r < size(); ++r) srcs.push_back(at(input(r), begin * es));
    return device(group_->post(rank()).op, ops_.reduce(out.raw(), srcs, n, out.dtype(), op));
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

  Status check_input(const char* op, const Tensor& t, bool reduction) {
    if (group_->poisoned()) return group_->failed(rank(), op);
    if (!t.defined()) return invalid_argument(std::string(op) + ": undefined tensor");
    if (!(t.device() == ops_.device()))
      return invalid_argument(std::string(op) + ": the " + name() + " communicator of " + layout_.describe() +
                              " needs tensors on " + ops_.device().to_string() + ", got " + t.describe() + " on " +
                              t.device().to_string());
    if (!t.is_contiguous()) return invalid_argument(std::string(op) + ": needs a contiguous tensor, got " + t.describe());
    if (reduction && !reducible(t.dtype()))
      return unsupported(std::string(op) + ": the " + name() + " communicator reduces f32, bf16 and f16, got " +
                         t.describe());
    return Status::ok();
  }
  Status check_rows(const char* op, const Tensor& t) {
    MX_RETURN_IF_ERROR(check_input(op, t, false));
    if (t.ndim() < 1) return invalid_argument(std::string(op) + ": needs a tensor with rows, got " + t.describe());
    return Status::ok();
  }

  RankLayout layout_;
  std::shared_ptr<DeviceGroup> group_;
  RankDeviceOps& ops_;
};

// Host memory: every call completes before it returns, so the marks have nothing to order.
class HostRankOps final : public RankDeviceOps {
 public:
  Device device() const override { return Device::cpu(); }
  Tensor alloc(DType dtype, const Shape& shape) override { return Tensor::empty(dtype, shape); }
  Status copy(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status copy_2d(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows) override {
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dpitch, static_cast<const char*>(src) + i * spitch, width);
    return Status::ok();
  }
  Status reduce(void* dst, const std::vector<const void*>& srcs, int64_t n, DType dtype, ReduceOp op) override {
    if (dtype != DType::kF32 && dtype != DType::kBF16)
      return unsupported(std::string("host rank ops reduce f32 and bf16, got ") + dtype_name(dtype));
    auto load = [&](const void* p, int64_t i) {
      return dtype == DType::kF32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    };
    for (int64_t i = 0; i < n; ++i) {
      float acc = load(srcs[0], i);
      for (size_t r = 1; r < srcs.size(); ++r) acc = op == ReduceOp::kSum ? acc + load(srcs[r], i) : std::max(acc, load(srcs[r], i));
      if (dtype == DType::kF32) static_cast<float*>(dst)[i] = acc;
      else static_cast<uint16_t*>(dst)[i] = f32_to_bf16(acc);
    }
    return Status::ok();
  }
  Status reduce_add_rmsnorm(const std::vector<const void*>& srcs, void* residual, const void* weight, void* out,
                            int64_t rows, int64_t cols, float eps, DType dtype) override {
    if (dtype != DType::kF32 && dtype != DType::kBF16)
      return unsupported(std::string("host rank ops: the fused add + RMSNorm takes f32 and bf16, got ") +
                         dtype_name(dtype));
    const bool bf = dtype == DType::kBF16;
    auto load = [&](const void* p, int64_t i) {
      return bf ? bf16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
    };
    auto round = [&](float v) { return bf ? bf16_to_f32(f32_to_bf16(v)) : v; };
    auto store = [&](void* p, int64_t i, float v) {
      if (bf) static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      else static_cast<float*>(p)[i] = v;
    };
    for (int64_t row = 0; row < rows; ++row) {
      float ss = 0.f;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = row * cols + c;
        float acc = 0.f;
        for (const void* s : srcs) acc += load(s, i);
        const float r = round(load(residual, i) + acc);
        store(residual, i, r);
        ss += r * r;
      }
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(cols) + eps);
      for (int64_t c = 0; c < cols; ++c)
        store(out, row * cols + c, load(weight, c) * (load(residual, row * cols + c) * inv));
    }
    return Status::ok();
  }
  Status record(Mark) override { return Status::ok(); }
  Status wait_for(RankDeviceOps&, Mark) override { return Status::ok(); }
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_device_group_communicators(
    const std::vector<RankLayout>& layouts, std::vector<std::unique_ptr<RankDeviceOps>> ops,
    const DeviceGroupOptions& options) {
  const int n = static_cast<int>(layouts.size());
  if (n < 1) return invalid_argument("make_device_group_communicators: no ranks");
  if (static_cast<int>(ops.size()) != n)
    return invalid_argument("make_device_group_communicators: " + std::to_string(n) + " rank(s) but " +
                            std::to_string(ops.size()) + " device side(s)");
  for (int r = 0; r < n; ++r) {
    if (layouts[r].rank != r || layouts[r].world() != n)
      return invalid_argument("make_device_group_communicators: layout " + std::to_string(r) + " is " +
                              layouts[r].describe() + ", expected rank " + std::to_string(r) + " of a world of " +
                              std::to_string(n));
    if (ops[r] == nullptr) return invalid_argument("make_device_group_communicators: rank " + std::to_string(r) + " has no device side");
    if (!(ops[r]->device() == ops[0]->device()))
      return invalid_argument("make_device_group_communicators: rank " + std::to_string(r) + " is on " +
                              ops[r]->device().to_string() + ", rank 0 on " + ops[0]->device().to_string() +
                              " (every rank of the group shares one device)");
  }
  if (options.timeout.count() <= 0) return invalid_argument("make_device_group_communicators: the timeout must be positive");
  auto group = std::make_shared<DeviceGroup>(std::move(ops), options);
  std::vector<std::unique_ptr<Communicator>> out;
  for (const RankLayout& l : layouts) out.push_back(std::make_unique<DeviceGroupCommunicator>(l, group));
  return out;
}

std::unique_ptr<RankDeviceOps> make_host_rank_ops() { return std::make_unique<HostRankOps>(); }

}  // namespace mxserve::parallel
