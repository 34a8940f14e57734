#include "parallel/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "core/logging.h"
#include "parallel/tcp_link.h"

namespace mxserve::parallel {
namespace {

// Gloo's Store over node 0's TCP key-value store (one client per rank; Gloo calls it from that rank's thread).
class LinkStore final : public gloo::rendezvous::Store {
 public:
  explicit LinkStore(std::unique_ptr<KvStoreClient> client) : client_(std::move(client)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = client_->set("gloo/" + key, std::string(data.begin(), data.end()));
    if (!s.is_ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_->get("gloo/" + key);
    if (!v.is_ok()) throw std::runtime_error(v.status().message());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) (void)get(k);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  std::unique_ptr<KvStoreClient> client_;
};

// What one rank brings to a collective: the op, its tensor's dtype and shape, and op-specific counts.
struct Header {
  std::string op;
  int64_t dtype = 0;
  std::vector<int64_t> shape, extra;
  std::string describe() const {
    std::string s = op + " " + dtype_name(static_cast<DType>(dtype)) + "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

std::string encode(const Header& h, const Tensor& t) {
  std::vector<int64_t> words = {static_cast<int64_t>(h.op.size()), h.dtype, static_cast<int64_t>(h.shape.size()),
                                static_cast<int64_t>(h.extra.size())};
  words.insert(words.end(), h.shape.begin(), h.shape.end());
  words.insert(words.end(), h.extra.begin(), h.extra.end());
  std::string out(reinterpret_cast<const char*>(words.data()), words.size() * 8);
  out += h.op;
  out.append(static_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

struct Received {
  Header header;
  const char* data = nullptr;
  uint64_t bytes = 0;
};

std::optional<Received> decode(const std::string& s) {
  if (s.size() < 32) return std::nullopt;
  int64_t w[4];
  std::memcpy(w, s.data(), 32);
  if (w[0] < 0 || w[2] < 0 || w[3] < 0 || w[2] > 16 || w[3] > 4096) return std::nullopt;
  const uint64_t head = 32 + 8 * uint64_t(w[2] + w[3]) + uint64_t(w[0]);
  if (head > s.size()) return std::nullopt;
  Received r;
  r.header.dtype = w[1];
  r.header.shape.resize(w[2]);
  r.header.extra.resize(w[3]);
  std::memcpy(r.header.shape.data(), s.data() + 32, 8 * w[2]);
  std::memcpy(r.header.extra.data(), s.data() + 32 + 8 * w[2], 8 * w[3]);
  r.header.op.assign(s.data() + 32 + 8 * (w[2] + w[3]), w[0]);
  r.data = s.data() + head;
  r.bytes = s.size() - head;
  return r;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(RankLayout layout, std::shared_ptr<gloo::Context> ctx, int ranks_per_node)
      : layout_(layout), ctx_(std::move(ctx)), ranks_per_node_(ranks_per_node) {}
  ~GlooCommunicator() override {
    if (ctx_) ctx_->closeConnections();
  }

  std::string name() const override { return "gloo"; }
  const RankLayout& layout() const override { return layout_; }

  Status all_reduce(Tensor& x, ReduceOp op) override {
    MX_ASSIGN_OR_RETURN(auto all, exchange(Header{"all_reduce", 0, {}, {static_cast<int64_t>(op)}}, x, /*same_shape=*/true));
    MX_RETURN_IF_ERROR(check_f32("all_reduce", x));
    reduce_into(all, 0, x.numel(), op, x.data<float>());
    return Status::ok();
  }

  Result<Tensor> all_gather(const Tensor& in) override {
    MX_ASSIGN_OR_RETURN(auto all, exchange(Header{"all_gather", 0, {}, {}}, in, true));
    Shape shape = in.shape();
    if (shape.empty()) return invalid_argument("all_gather: a scalar tensor on rank " + std::to_string(rank()));
    shape[0] *= size();
    return concat(all, in.dtype(), shape);
  }

  Result<Tensor> reduce_scatter(const Tensor& in, ReduceOp op) override {
    if (in.ndim() < 1 || in.dim(0) % size() != 0)
      return invalid_argument("reduce_scatter: " + in.describe() + " has no leading dim divisible by " +
                              std::to_string(size()) + " ranks (rank " + std::to_string(rank()) + ")");
    MX_ASSIGN_OR_RETURN(auto all, exchange(Header{"reduce_scatter", 0, {}, {static_cast<int64_t>(op)}}, in, true));
    MX_RETURN_IF_ERROR(check_f32("reduce_scatter", in));
    Shape shape = in.shape();
    shape[0] /= size();
    Tensor out = Tensor::empty(in.dtype(), shape);
    reduce_into(all, rank() * out.numel(), out.numel(), op, out.data<float>());
    return out;
  }

  Result<Tensor> all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows,
                            std::vector<int64_t>* recv_rows) override {
    if (static_cast<int>(send_rows.size()) != size() || in.ndim() < 1)
      return invalid_argument("all_to_all: send_rows has " + std::to_string(send_rows.size()) + " counts for " +
                              std::to_string(size()) + " ranks (rank " + std::to_string(rank()) + ")");
    int64_t total = 0;
    for (int64_t n : send_rows) total += n;
    if (total != in.dim(0))
      return invalid_argument("all_to_all: send_rows sum to " + std::to_string(total) + " but the input is " +
                              in.describe() + " (rank " + std::to_string(rank()) + ")");
    MX_ASSIGN_OR_RETURN(auto all, exchange(Header{"all_to_all", 0, {}, send_rows}, in, false));
    const uint64_t row_bytes = bytes_per_row(in);
    Shape shape = in.shape();
    shape[0] = 0;
    std::vector<int64_t> got(size());
    for (int s = 0; s < size(); ++s) shape[0] += got[s] = all[s].header.extra[rank()];
    Tensor out = Tensor::empty(in.dtype(), shape);
    char* dst = static_cast<char*>(out.raw());
    for (int s = 0; s < size(); ++s) {
      int64_t before = 0;
      for (int r = 0; r < rank(); ++r) before += all[s].header.extra[r];
      std::memcpy(dst, all[s].data + before * row_bytes, got[s] * row_bytes);
      dst += got[s] * row_bytes;
    }
    if (recv_rows != nullptr) *recv_rows = got;
    return out;
  }

  Result<Tensor> all_gather_v(const Tensor& in, std::vector<int64_t>* rows) override {
    if (in.ndim() < 1) return invalid_argument("all_gather_v: a scalar tensor on rank " + std::to_string(rank()));
    MX_ASSIGN_OR_RETURN(auto all, exchange(Header{"all_gather_v", 0, {}, {}}, in, false));
    Shape shape = in.shape();
    shape[0] = 0;
    std::vector<int64_t> counts(size());
    for (int s = 0; s < size(); ++s) shape[0] += counts[s] = all[s].header.shape[0];
    if (rows != nullptr) *rows = counts;
    return concat(all, in.dtype(), shape);
  }

  Result<Tensor> reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& rows, ReduceOp op) override {
    int64_t total = 0, before = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (static_cast<int>(r) < rank()) before += rows[r];
      total += rows[r];
    }
    if (static_cast<int>(rows.size()) != size() || in.ndim() < 1 || in.dim(0) != total)
      return invalid_argument("reduce_scatter_v: rows do not match " + in.describe() + " over " +
                              std::to_string(size()) + " ranks (rank " + std::to_string(rank()) + ")");
    Header h{"reduce_scatter_v", 0, {}, rows};
    h.extra.push_back(static_cast<int64_t>(op));
    MX_ASSIGN_OR_RETURN(auto all, exchange(h, in, true));
    MX_RETURN_IF_ERROR(check_f32("reduce_scatter_v", in));
    Shape shape = in.shape();
    shape[0] = rows[rank()];
    Tensor out = Tensor::empty(in.dtype(), shape);
    const int64_t per_row = in.numel() / std::max<int64_t>(in.dim(0), 1);
    reduce_into(all, before * per_row, out.numel(), op, out.data<float>());
    return out;
  }

  Result<Tensor> all_gather_columns(const Tensor& in) override {
    if (in.ndim() != 2) return invalid_argument("all_gather_columns: " + in.describe() + " is not [R, C]");
    MX_ASSIGN_OR_RETURN(auto all, exchange(Header{"all_gather_columns", 0, {}, {}}, in, true));
    const int64_t R = in.dim(0), C = in.dim(1), esize = dtype_bits(in.dtype()) / 8;
    Tensor out = Tensor::empty(in.dtype(), {R, size() * C});
    char* dst = static_cast<char*>(out.raw());
    for (int64_t r = 0; r < R; ++r)
      for (int s = 0; s < size(); ++s)
        std::memcpy(dst + (r * size() + s) * C * esize, all[s].data + r * C * esize, C * esize);
    return out;
  }

  Status barrier() override {
    return guarded("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      gloo::barrier(opts);
    });
  }

  void abort(const Status& why) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_.is_ok()) return;
    poison_ = Status(why.is_ok() ? StatusCode::kInternal : why.code(), where() + " failed: " + why.message());
    if (ctx_) ctx_->closeConnections();  // the peers' pending collectives fail now, not at their timeout
  }

 private:
  std::string where() const {
    return "rank " + std::to_string(rank()) + "/" + std::to_string(size()) + " on node " +
           std::to_string(rank() / ranks_per_node_);
  }

  template <typename Fn>
  Status guarded(const std::string& op, Fn&& fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!poison_.is_ok())
        return Status(poison_.code(), op + " on " + where() + ": the rank group failed (" + poison_.message() + ")");
    }
    try {
      fn();
      return Status::ok();
    } catch (const std::exception& e) {
      Status s = unavailable(op + " on " + where() + ": the rank group failed (a peer rank stopped, failed or "
                             "stalled; see the other nodes' logs): Gloo: " + e.what());
      abort(s);
      return s;
    }
  }

  Status check_f32(const std::string& op, const Tensor& t) const {
    if (t.dtype() == DType::kF32) return Status::ok();
    return unsupported(op + ": the Gloo communicator reduces f32 only, got " + t.describe());
  }

  static uint64_t bytes_per_row(const Tensor& t) {
    return t.dim(0) == 0 ? 0 : t.nbytes() / static_cast<uint64_t>(t.dim(0));
  }

  // Every rank's header and bytes, in rank order (views into bufs_). same_shape: every rank must bring this
  // rank's shape; else the same dims after the first.
  Result<std::vector<Received>> exchange(Header h, const Tensor& t, bool same_shape) {
    if (!t.is_contiguous()) return invalid_argument(h.op + ": " + t.describe() + " is not contiguous");
    h.dtype = static_cast<int64_t>(t.dtype());
    h.shape = t.shape();
    const std::string mine = encode(h, t);
    std::vector<uint64_t> sizes(size(), mine.size());
    if (same_shape) {  // one round: every rank brings the same bytes (a rank that does not fails Gloo's size check)
      buf_.assign(mine.size() * size(), '\0');
      MX_RETURN_IF_ERROR(guarded(h.op, [&] {
        gloo::AllgatherOptions opts(ctx_);
        opts.setInput(const_cast<char*>(mine.data()), mine.size());
        opts.setOutput(buf_.data(), buf_.size());
        gloo::allgather(opts);
      }));
      return split(h, sizes, same_shape);
    }
    MX_RETURN_IF_ERROR(guarded(h.op, [&] {
      uint64_t n = mine.size();
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(&n, 1);
      opts.setOutput(sizes.data(), sizes.size());
      gloo::allgather(opts);
    }));
    uint64_t total = 0;
    for (uint64_t n : sizes) total += n;
    buf_.assign(total, '\0');
    MX_RETURN_IF_ERROR(guarded(h.op, [&] {
      gloo::AllgathervOptions opts(ctx_);
      opts.setInput(const_cast<char*>(mine.data()), mine.size());
      opts.setOutput(buf_.data(), std::vector<size_t>(sizes.begin(), sizes.end()));
      gloo::allgatherv(opts);
    }));
    return split(h, sizes, same_shape);
  }

  // buf_ (every rank's post, sizes[s] bytes each, in rank order) -> the checked posts.
  Result<std::vector<Received>> split(const Header& h, const std::vector<uint64_t>& sizes, bool same_shape) {
    std::vector<Received> all;
    uint64_t off = 0;
    parts_.clear();
    for (int s = 0; s < size(); ++s) {
      parts_.push_back(buf_.substr(off, sizes[s]));
      off += sizes[s];
    }
    for (int s = 0; s < size(); ++s) {
      auto r = decode(parts_[s]);
      if (!r) return data_loss(h.op + " on " + where() + ": rank " + std::to_string(s) + " sent a malformed post");
      all.push_back(*r);
    }
    // The same check on every rank: every rank sees every header, so every rank returns the same error.
    for (int s = 0; s < size(); ++s) {
      const Header& o = all[s].header;
      bool ok = o.op == h.op && o.dtype == h.dtype && o.shape.size() == h.shape.size();
      for (size_t d = same_shape ? 0 : 1; ok && d < h.shape.size(); ++d) ok = o.shape[d] == all[0].header.shape[d];
      if (!ok)
        return invalid_argument("collective mismatch: rank 0 brought " + all[0].header.describe() + ", rank " +
                                std::to_string(s) + " brought " + o.describe() + " (seen on " + where() + ")");
    }
    return all;
  }

  void reduce_into(const std::vector<Received>& all, int64_t offset, int64_t n, ReduceOp op, float* out) const {
    const float* first = reinterpret_cast<const float*>(all[0].data) + offset;
    std::memcpy(out, first, n * sizeof(float));
    for (size_t s = 1; s < all.size(); ++s) {
      const float* p = reinterpret_cast<const float*>(all[s].data) + offset;
      if (op == ReduceOp::kSum)
        for (int64_t i = 0; i < n; ++i) out[i] += p[i];
      else
        for (int64_t i = 0; i < n; ++i) out[i] = std::max(out[i], p[i]);
    }
  }

  static Tensor concat(const std::vector<Received>& all, DType dtype, const Shape& shape) {
    Tensor out = Tensor::empty(dtype, shape);
    char* dst = static_cast<char*>(out.raw());
    for (const Received& r : all) {
      std::memcpy(dst, r.data, r.bytes);
      dst += r.bytes;
    }
    return out;
  }

  RankLayout layout_;
  std::shared_ptr<gloo::Context> ctx_;
  int ranks_per_node_;
  std::mutex mutex_;
  Status poison_ = Status::ok();
  std::string buf_;
  std::vector<std::string> parts_;
};

}  // namespace

bool gloo_available() { return true; }

Result<std::vector<std::unique_ptr<Communicator>>> make_gloo_communicators(const std::vector<RankLayout>& local,
                                                                           const GlooOptions& options) {
  const int n = static_cast<int>(local.size());
  std::vector<std::shared_ptr<gloo::Context>> contexts(n);
  std::vector<Status> errors(n, Status::ok());
  gloo::transport::tcp::attr attr;
  attr.hostname = options.bind_host;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return unavailable("Gloo cannot listen on " + options.bind_host + " (this node's address for the other nodes): " +
                       e.what());
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      const RankLayout& l = local[i];
      auto client = KvStoreClient::connect(options.store_host, options.store_port, options.timeout);
      if (!client.is_ok()) {
        errors[i] = client.status();
        return;
      }
      LinkStore store(std::move(*client));
      try {
        auto ctx = std::make_shared<gloo::rendezvous::Context>(l.rank, l.world());
        ctx->setTimeout(options.timeout);
        ctx->connectFullMesh(store, device);
        contexts[i] = ctx;
      } catch (const std::exception& e) {
        errors[i] = unavailable(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i)
    if (!errors[i].is_ok())
      return errors[i].with_context("rank " + std::to_string(local[i].rank) + " on node " +
                                    std::to_string(local[i].rank / options.ranks_per_node) +
                                    " could not connect to the other ranks (Gloo full mesh)");
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_unique<GlooCommunicator>(local[i], contexts[i], options.ranks_per_node));
  MX_LOG(kInfo) << "gloo: " << n << " local rank(s) of " << (n > 0 ? local[0].world() : 0) << " connected via "
                << options.bind_host;
  return out;
}

}  // namespace mxserve::parallel
