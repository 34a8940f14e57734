#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "backend/cuda_backend.h"
#include "parallel/nccl_api.h"
#include "parallel/recoverable.h"

namespace mxserve::parallel {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold an ncclUniqueId");

std::string nccl_error(const NcclApi& api, const std::string& what, ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string s = what + ": " + api.GetErrorString(r);
  if (comm != nullptr) {
    const char* last = api.GetLastError(comm);
    if (last != nullptr && *last != '\0') s += std::string(" (") + last + ")";
  }
  return s;
}
std::string cuda_error(const std::string& what, cudaError_t e) {
  return what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

bool reduction_type(DType d, ncclDataType_t* t) {
  switch (d) {
    case DType::kF32: *t = ncclFloat32; return true;
    case DType::kBF16: *t = ncclBfloat16; return true;
    case DType::kF16: *t = ncclFloat16; return true;
    case DType::kI32: *t = ncclInt32; return true;
    case DType::kI64: *t = ncclInt64; return true;
    default: return false;
  }
}

int64_t row_bytes(const Tensor& t) {
  int64_t n = dtype_bits(t.dtype()) / 8;
  for (int d = 1; d < t.ndim(); ++d) n *= t.dim(d);
  return n;
}

// The state the local ranks of one group share: their NCCL communicators and the poison flag.
struct NcclGroup {
  const NcclApi* api = nullptr;
  std::mutex mutex;
  bool poisoned = false;
  Status cause;
  int world = 0;
  std::vector<ncclComm_t> comms;  // local ranks' communicators (index: local rank)
  std::vector<int> devices;
  std::vector<int> ranks;      // local ranks' global ranks
  bool in_process = false;     // every rank of the world is here (made without a rendezvous id): re-creatable
  uint64_t epoch = 0;          // bumped by each re-initialisation (communicators refresh their handle)
  std::vector<bool> aborted;

  ~NcclGroup() {
    for (size_t i = 0; i < comms.size(); ++i)
      if (comms[i] != nullptr && !aborted[i]) {
        cudaSetDevice(devices[i]);  // teardown: errors are not actionable here
        api->CommDestroy(comms[i]);
      }
  }
  // Records the first failure and aborts every local communicator (their kernels stop waiting).
  void poison(Status why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!poisoned) cause = std::move(why);
    poisoned = true;
    for (size_t i = 0; i < comms.size(); ++i)
      if (comms[i] != nullptr && !aborted[i]) {
        api->CommAbort(comms[i]);
        aborted[i] = true;
      }
  }
  bool is_poisoned(Status* why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (poisoned && why != nullptr) *why = cause;
    return poisoned;
  }
  // parallel/recoverable.h, at a quiet point: ncclCommAbort is terminal, so every local communicator is made
  // again over a fresh ncclGetUniqueId (one thread per local rank, as at start-up). Only an in-process world
  // whose failure was a device out-of-memory comes back: ranks in other processes would need a new rendezvous
  // (not built), and a timeout or an NCCL / CUDA error may mean a lost rank or a broken device.
  Status reinit() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!poisoned) return Status::ok();
    if (!in_process)
      return Status(cause.code(), "the NCCL group cannot recover: its ranks span processes (a new rendezvous "
                                  "would be needed; not built): " + cause.message());
    if (cause.code() != StatusCode::kOutOfMemory)
      return Status(cause.code(), "the NCCL group cannot recover from this failure (only a device out-of-memory "
                                  "is): " + cause.message());
    ncclUniqueId uid;
    ncclResult_t r = api->GetUniqueId(&uid);
    if (r != ncclSuccess) return unavailable(nccl_error(*api, "re-initialising the NCCL group: ncclGetUniqueId", r));
    const int n = static_cast<int>(comms.size());
    std::vector<ncclComm_t> made(n, nullptr);
    std::vector<ncclResult_t> results(n, ncclSuccess);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        if (cudaSetDevice(devices[i]) != cudaSuccess) {
          results[i] = ncclUnhandledCudaError;
          return;
        }
        results[i] = api->CommInitRank(&made[i], world, uid, ranks[i]);
      });
    for (auto& t : threads) t.join();
    for (int i = 0; i < n; ++i)
      if (results[i] != ncclSuccess) {
        for (int j = 0; j < n; ++j)
          if (made[j] != nullptr) api->CommAbort(made[j]);
        return unavailable(nccl_error(*api, "re-initialising the NCCL group: ncclCommInitRank of rank " +
                                                std::to_string(ranks[i]), results[i]));
      }
    comms = made;
    aborted.assign(n, false);
    poisoned = false;
    cause = Status();
    ++epoch;
    return Status::ok();
  }
};

class NcclCommunicator final : public Communicator, public RecoverableGroup {
 public:
  NcclCommunicator(const RankLayout& layout, backend::Backend* be, std::shared_ptr<NcclGroup> group, int local,
                   const NcclOptions& options)
      : layout_(layout), be_(be), stream_(reinterpret_cast<cudaStream_t>(backend::cuda_backend_stream(*be))),
        group_(std::move(group)), api_(group_->api), local_(local), comm_(group_->comms[local]), options_(options) {
    scratch_ = be_->alloc(DType::kI32, {1});
  }
  std::string name() const override { return "nccl x" + std::to_string(size()); }
  const RankLayout& layout() const override { return layout_; }

  Status all_reduce(Tensor& x, ReduceOp op) override {
    MX_RETURN_IF_ERROR(check("all_reduce", x, false));
    ncclDataType_t t;
    if (!reduction_type(x.dtype(), &t))
      return unsupported("all_reduce: NCCL reduces f32, bf16, f16, i32 and i64, got " + x.describe());
    if (x.numel() == 0) return Status::ok();
    return nccl("all_reduce", api_->AllReduce(x.raw(), x.raw(), x.numel(), t, nccl_op(op), comm_, stream_));
  }

  Result<Tensor> all_gather(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check("all_gather", in, true));
    Shape shape = in.shape();
    shape[0] *= size();
    Tensor out = be_->alloc(in.dtype(), shape);
    if (in.nbytes() > 0)
      MX_RETURN_IF_ERROR(nccl("all_gather", api_->AllGather(in.raw(), out.raw(), in.nbytes(), ncclUint8, comm_, stream_)));
    return out;
  }

  Result<Tensor> reduce_scatter(const Tensor& in, ReduceOp op) override {
    MX_RETURN_IF_ERROR(check("reduce_scatter", in, true));
    ncclDataType_t t;
    if (!reduction_type(in.dtype(), &t))
      return unsupported("reduce_scatter: NCCL reduces f32, bf16, f16, i32 and i64, got " + in.describe());
    if (in.dim(0) % size() != 0)
      return invalid_argument("reduce_scatter: " + in.describe() + " does not split into " + std::to_string(size()) +
                              " equal row blocks");
    Shape shape = in.shape();
    shape[0] /= size();
    Tensor out = be_->alloc(in.dtype(), shape);
    if (out.numel() > 0)
      MX_RETURN_IF_ERROR(nccl("reduce_scatter", api_->ReduceScatter(in.raw(), out.raw(), out.numel(), t, nccl_op(op),
                                                                  comm_, stream_)));
    return out;
  }

  Result<Tensor> all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows,
                            std::vector<int64_t>* recv_rows) override {
    MX_RETURN_IF_ERROR(check("all_to_all", in, true));
    int64_t total = 0;
    bool negative = false;
    for (int64_t n : send_rows) total += n, negative = negative || n < 0;
    if (static_cast<int>(send_rows.size()) != size() || total != in.dim(0) || negative)
      return invalid_argument("all_to_all: send_rows must name " + std::to_string(size()) +
                              " rank(s) with non-negative counts summing to the " + std::to_string(in.dim(0)) +
                              " rows of " + in.describe());
    // Every rank's send counts -> everyone (recv[r] = rank r's count for this rank).
    Tensor mine = be_->alloc(DType::kI64, {size()});
    MX_RETURN_IF_ERROR(cuda("all_to_all: uploading the row counts",
                            cudaMemcpyAsync(mine.raw(), send_rows.data(), size() * sizeof(int64_t),
                                            cudaMemcpyHostToDevice, stream_)));
    Tensor all = be_->alloc(DType::kI64, {size() * size()});
    MX_RETURN_IF_ERROR(nccl("all_to_all (row counts)", api_->AllGather(mine.raw(), all.raw(), size(), ncclInt64, comm_,
                                                                     stream_)));
    MX_RETURN_IF_ERROR(wait("all_to_all"));
    std::vector<int64_t> counts(size() * size());
    MX_RETURN_IF_ERROR(cuda("all_to_all: reading the row counts",
                            cudaMemcpy(counts.data(), all.raw(), counts.size() * sizeof(int64_t), cudaMemcpyDeviceToHost)));
    std::vector<int64_t> recv(size());
    Shape shape = in.shape();
    shape[0] = 0;
    for (int r = 0; r < size(); ++r) shape[0] += recv[r] = counts[r * size() + rank()];
    Tensor out = be_->alloc(in.dtype(), shape);
    const int64_t rb = row_bytes(in);
    MX_RETURN_IF_ERROR(nccl("all_to_all", api_->GroupStart()));
    int64_t send_off = 0, recv_off = 0;
    ncclResult_t res = ncclSuccess;
    for (int r = 0; r < size() && res == ncclSuccess; ++r) {
      if (send_rows[r] > 0 && rb > 0)
        res = api_->Send(static_cast<const char*>(in.raw()) + send_off * rb, send_rows[r] * rb, ncclUint8, r, comm_, stream_);
      if (res == ncclSuccess && recv[r] > 0 && rb > 0)
        res = api_->Recv(static_cast<char*>(out.raw()) + recv_off * rb, recv[r] * rb, ncclUint8, r, comm_, stream_);
      send_off += send_rows[r];
      recv_off += recv[r];
    }
    const ncclResult_t end = api_->GroupEnd();
    MX_RETURN_IF_ERROR(nccl("all_to_all", res != ncclSuccess ? res : end));
    if (recv_rows != nullptr) *recv_rows = recv;
    return out;
  }

  Result<Tensor> all_gather_v(const Tensor& in, std::vector<int64_t>* rows) override {
    MX_RETURN_IF_ERROR(check("all_gather_v", in, true));
    // Every rank's row count -> everyone, then grouped send / receive of the rows (NCCL's AllGather needs
    // equal counts). This rank's own rows are a local copy.
    const int64_t mine_rows = in.dim(0);
    Tensor mine = be_->alloc(DType::kI64, {1});
    MX_RETURN_IF_ERROR(cuda("all_gather_v: uploading the row count",
                            cudaMemcpyAsync(mine.raw(), &mine_rows, sizeof(int64_t), cudaMemcpyHostToDevice, stream_)));
    Tensor all = be_->alloc(DType::kI64, {size()});
    MX_RETURN_IF_ERROR(nccl("all_gather_v (row counts)", api_->AllGather(mine.raw(), all.raw(), 1, ncclInt64, comm_,
                                                                       stream_)));
    MX_RETURN_IF_ERROR(wait("all_gather_v"));
    std::vector<int64_t> counts(size());
    MX_RETURN_IF_ERROR(cuda("all_gather_v: reading the row counts",
                            cudaMemcpy(counts.data(), all.raw(), counts.size() * sizeof(int64_t), cudaMemcpyDeviceToHost)));
    Shape shape = in.shape();
    shape[0] = 0;
    for (int64_t n : counts) shape[0] += n;
    Tensor out = be_->alloc(in.dtype(), shape);
    const int64_t rb = row_bytes(in);
    int64_t my_off = 0;
    for (int r = 0; r < rank(); ++r) my_off += counts[r];
    if (mine_rows > 0 && rb > 0)
      MX_RETURN_IF_ERROR(cuda("all_gather_v: this rank's rows",
                              cudaMemcpyAsync(static_cast<char*>(out.raw()) + my_off * rb, in.raw(), mine_rows * rb,
                                              cudaMemcpyDeviceToDevice, stream_)));
    MX_RETURN_IF_ERROR(nccl("all_gather_v", api_->GroupStart()));
    ncclResult_t res = ncclSuccess;
    int64_t off = 0;
    for (int r = 0; r < size() && res == ncclSuccess; ++r) {
      if (r != rank() && mine_rows > 0 && rb > 0) res = api_->Send(in.raw(), mine_rows * rb, ncclUint8, r, comm_, stream_);
      if (res == ncclSuccess && r != rank() && counts[r] > 0 && rb > 0)
        res = api_->Recv(static_cast<char*>(out.raw()) + off * rb, counts[r] * rb, ncclUint8, r, comm_, stream_);
      off += counts[r];
    }
    const ncclResult_t end = api_->GroupEnd();
    MX_RETURN_IF_ERROR(nccl("all_gather_v", res != ncclSuccess ? res : end));
    if (rows != nullptr) *rows = counts;
    return out;
  }

  // NOTE: an all-reduce of the whole tensor, then this rank's rows (NCCL's ReduceScatter needs equal blocks;
  // padding every block to the largest is the cheaper form, later work).
  Result<Tensor> reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& rows, ReduceOp op) override {
    MX_RETURN_IF_ERROR(check("reduce_scatter_v", in, true));
    int64_t total = 0, my_off = 0;
    bool negative = false;
    for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
      negative = negative || rows[r] < 0;
      if (r < rank()) my_off += rows[r];
      total += rows[r];
    }
    if (static_cast<int>(rows.size()) != size() || negative || total != in.dim(0))
      return invalid_argument("reduce_scatter_v: rows must name " + std::to_string(size()) +
                              " rank(s) with non-negative counts summing to the " + std::to_string(in.dim(0)) +
                              " rows of " + in.describe());
    Tensor sum = be_->alloc(in.dtype(), in.shape());
    if (in.nbytes() > 0)
      MX_RETURN_IF_ERROR(cuda("reduce_scatter_v: copy", cudaMemcpyAsync(sum.raw(), in.raw(), in.nbytes(),
                                                                       cudaMemcpyDeviceToDevice, stream_)));
    MX_RETURN_IF_ERROR(all_reduce(sum, op));
    Shape shape = in.shape();
    shape[0] = rows[rank()];
    Tensor out = be_->alloc(in.dtype(), shape);
    const int64_t rb = row_bytes(in);
    if (out.nbytes() > 0)
      MX_RETURN_IF_ERROR(cuda("reduce_scatter_v: this rank's rows",
                              cudaMemcpyAsync(out.raw(), static_cast<const char*>(sum.raw()) + my_off * rb,
                                              out.nbytes(), cudaMemcpyDeviceToDevice, stream_)));
    return out;
  }

  Result<Tensor> all_gather_columns(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check("all_gather_columns", in, false));
    if (in.ndim() != 2) return invalid_argument("all_gather_columns: needs a 2-D tensor, got " + in.describe());
    const int64_t R = in.dim(0), C = in.dim(1), es = dtype_bits(in.dtype()) / 8;
    Tensor blocks = be_->alloc(in.dtype(), {size() * R, C});  // rank-major [size][R, C]
    Tensor out = be_->alloc(in.dtype(), {R, size() * C});
    if (in.nbytes() == 0) return out;
    MX_RETURN_IF_ERROR(nccl("all_gather_columns",
                            api_->AllGather(in.raw(), blocks.raw(), in.nbytes(), ncclUint8, comm_, stream_)));
    for (int r = 0; r < size(); ++r)
      MX_RETURN_IF_ERROR(cuda("all_gather_columns: interleaving rank " + std::to_string(r) + "'s columns",
                              cudaMemcpy2DAsync(static_cast<char*>(out.raw()) + r * C * es, size() * C * es,
                                                static_cast<const char*>(blocks.raw()) + r * R * C * es, C * es, C * es,
                                                R, cudaMemcpyDeviceToDevice, stream_)));
    return out;
  }

  Status barrier() override {
    MX_RETURN_IF_ERROR(check_group("barrier"));
    cudaSetDevice(layout_.device);
    MX_RETURN_IF_ERROR(nccl("barrier", api_->AllReduce(scratch_.raw(), scratch_.raw(), 1, ncclInt32, ncclSum, comm_, stream_)));
    return wait("barrier");
  }

  void abort(const Status& why) override {
    group_->poison(Status(why.is_ok() ? StatusCode::kInternal : why.code(),
                          "rank " + std::to_string(rank()) + " failed: " + why.message()));
  }
  // The first local rank's call re-creates the group's communicators (NcclGroup::reinit); every call then
  // takes its rank's new handle.
  Status reset_after_abort() override {
    MX_RETURN_IF_ERROR(group_->reinit());
    std::lock_guard<std::mutex> lock(group_->mutex);
    comm_ = group_->comms[local_];
    return Status::ok();
  }

 private:
  static ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

  Status failed(const std::string& op) {
    Status why;
    group_->is_poisoned(&why);
    return Status(why.code(), op + " on rank " + std::to_string(rank()) + " of " + std::to_string(size()) +
                                  ": the rank group failed (" + why.message() + ")");
  }
  Status check_group(const std::string& op) {
    if (group_->is_poisoned(nullptr)) return failed(op);
    return Status::ok();
  }
  Status check(const char* op, const Tensor& t, bool rows) {
    MX_RETURN_IF_ERROR(check_group(op));
    if (!t.defined()) return invalid_argument(std::string(op) + ": undefined tensor");
    if (t.device() != Device::cuda(layout_.device))
      return invalid_argument(std::string(op) + ": the NCCL communicator of " + layout_.describe() + " needs tensors on " +
                              Device::cuda(layout_.device).to_string() + ", got " + t.describe() + " on " +
                              t.device().to_string());
    if (!t.is_contiguous()) return invalid_argument(std::string(op) + ": needs a contiguous tensor, got " + t.describe());
    if (rows && t.ndim() < 1) return invalid_argument(std::string(op) + ": needs a tensor with rows, got " + t.describe());
    cudaSetDevice(layout_.device);
    return Status::ok();
  }
  Status nccl(const std::string& op, ncclResult_t r) {
    if (r == ncclSuccess) return Status::ok();
    if (group_->is_poisoned(nullptr)) return failed(op);
    Status s = internal_error(nccl_error(*api_, op + " on " + layout_.describe(), r, comm_));
    abort(s);
    return failed(op);
  }
  Status cuda(const std::string& op, cudaError_t e) {
    if (e == cudaSuccess) return Status::ok();
    Status s = internal_error(cuda_error(op + " on " + layout_.describe(), e));
    abort(s);
    return failed(op);
  }
  // Waits for the stream; gives up when the group is poisoned, NCCL reports an asynchronous error or the
  // timeout passes (the last two poison the group, naming this rank).
  Status wait(const std::string& op) {
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status::ok();
      if (e != cudaErrorNotReady) return cuda(op, e);
      if (group_->is_poisoned(nullptr)) return failed(op);
      ncclResult_t async = ncclSuccess;
      if (api_->CommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        return nccl(op + " (asynchronous error)", async);
      if (std::chrono::steady_clock::now() > deadline) {
        abort(unavailable(op + " waited " + std::to_string(options_.timeout.count() / 1000) +
                          " s for the other ranks of the group"));
        return failed(op);
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  RankLayout layout_;
  backend::Backend* be_;
  cudaStream_t stream_;
  std::shared_ptr<NcclGroup> group_;
  const NcclApi* api_;
  int local_;
  ncclComm_t comm_;
  NcclOptions options_;
  Tensor scratch_;  // i32 [1]: barrier()'s all-reduce
};

}  // namespace

Result<NcclId> make_nccl_unique_id() {
  MX_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  ncclUniqueId id;
  const ncclResult_t r = api->GetUniqueId(&id);
  if (r != ncclSuccess) return unavailable(nccl_error(*api, "ncclGetUniqueId", r));
  NcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(
    const std::vector<RankLayout>& local_ranks, const std::vector<backend::Backend*>& backends, const NcclId* id,
    const NcclOptions& options) {
  const int n = static_cast<int>(local_ranks.size());
  if (n < 1 || static_cast<int>(backends.size()) != n)
    return invalid_argument("make_nccl_communicators: " + std::to_string(n) + " rank(s) and " +
                            std::to_string(backends.size()) + " backend(s)");
  if (options.timeout.count() <= 0) return invalid_argument("make_nccl_communicators: the timeout must be positive");
  const int world = local_ranks.front().world();
  for (int i = 0; i < n; ++i) {
    if (local_ranks[i].world() != world)
      return invalid_argument("make_nccl_communicators: " + local_ranks[i].describe() + " is not of a world of " +
                              std::to_string(world));
    if (backends[i] == nullptr || backends[i]->device() != Device::cuda(local_ranks[i].device))
      return invalid_argument("make_nccl_communicators: " + local_ranks[i].describe() + " needs its CUDA backend on " +
                              Device::cuda(local_ranks[i].device).to_string() + ", got " +
                              (backends[i] ? backends[i]->name() + " on " + backends[i]->device().to_string() : "none"));
  }
  if (id == nullptr && n != world)
    return invalid_argument("make_nccl_communicators: in-process init needs all " + std::to_string(world) +
                            " ranks here, got " + std::to_string(n) + " (multi-node: pass the rendezvous id)");
  MX_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  NcclId made{};
  if (id == nullptr) {
    MX_ASSIGN_OR_RETURN(made, make_nccl_unique_id());
    id = &made;
  }
  ncclUniqueId uid;
  std::memcpy(&uid, id->data(), sizeof(uid));

  auto group = std::make_shared<NcclGroup>();
  group->api = api;
  group->world = world;
  group->comms.assign(n, nullptr);
  group->aborted.assign(n, false);
  group->in_process = n == world;
  for (const RankLayout& l : local_ranks) group->devices.push_back(l.device), group->ranks.push_back(l.rank);
  // One thread per local rank: ncclCommInitRank blocks until every rank of the world has joined.
  std::vector<ncclResult_t> results(n, ncclSuccess);
  std::vector<cudaError_t> set_device(n, cudaSuccess);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      set_device[i] = cudaSetDevice(local_ranks[i].device);
      if (set_device[i] == cudaSuccess)
        results[i] = api->CommInitRank(&group->comms[i], world, uid, local_ranks[i].rank);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    if (set_device[i] != cudaSuccess)
      return unavailable(cuda_error(local_ranks[i].describe() + ": cudaSetDevice", set_device[i]));
    if (results[i] != ncclSuccess)
      return unavailable(nccl_error(*api, local_ranks[i].describe() + " failed at start-up: ncclCommInitRank over " +
                                        std::to_string(world) + " rank(s)",
                                    results[i], group->comms[i]));
  }
  // Warm-up: one grouped all-reduce over the local ranks (one thread may drive several ranks inside a group
  // call) sets up NCCL's connections now, outside any CUDA graph capture, and proves the group works.
  std::vector<Tensor> probe;
  std::vector<cudaStream_t> streams;
  ncclResult_t warm = api->GroupStart();
  for (int i = 0; i < n && warm == ncclSuccess; ++i) {
    cudaSetDevice(local_ranks[i].device);
    probe.push_back(backends[i]->alloc(DType::kI32, {1}));
    streams.push_back(reinterpret_cast<cudaStream_t>(backend::cuda_backend_stream(*backends[i])));
    warm = api->AllReduce(probe[i].raw(), probe[i].raw(), 1, ncclInt32, ncclSum, group->comms[i], streams[i]);
  }
  const ncclResult_t end = api->GroupEnd();
  if (warm == ncclSuccess) warm = end;
  if (warm != ncclSuccess)
    return unavailable(nccl_error(*api, "the first all-reduce over " + std::to_string(world) + " NCCL rank(s)", warm));
  for (int i = 0; i < n; ++i) {
    const cudaError_t e = cudaStreamSynchronize(streams[i]);
    if (e != cudaSuccess)
      return unavailable(cuda_error(local_ranks[i].describe() + " failed at start-up: the first NCCL all-reduce", e));
  }
  probe.clear();
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_unique<NcclCommunicator>(local_ranks[i], backends[i], group, i, options));
  return out;
}

int visible_cuda_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void bind_thread_to_device(int device) { cudaSetDevice(device); }

}  // namespace mxserve::parallel
