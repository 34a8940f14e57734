#include "parallel/communicator.h"

namespace mxserve::parallel {
namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(const RankLayout& layout) : layout_(layout) {}
  std::string name() const override { return "single-rank"; }
  const RankLayout& layout() const override { return layout_; }

  Status all_reduce(Tensor& x, ReduceOp) override { return check_defined("all_reduce", x); }
  Result<Tensor> all_gather(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check_rows("all_gather", in));
    return in;
  }
  Result<Tensor> reduce_scatter(const Tensor& in, ReduceOp) override {
    MX_RETURN_IF_ERROR(check_rows("reduce_scatter", in));
    return in;
  }
  Result<Tensor> all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows,
                            std::vector<int64_t>* recv_rows) override {
    MX_RETURN_IF_ERROR(check_rows("all_to_all", in));
    if (send_rows.size() != 1 || send_rows[0] != in.dim(0))
      return invalid_argument("all_to_all: send_rows must name " + std::to_string(size()) +
                              " rank(s) and sum to the " + std::to_string(in.dim(0)) + " rows of " + in.describe());
    if (recv_rows != nullptr) *recv_rows = {in.dim(0)};
    return in;
  }
  Result<Tensor> all_gather_v(const Tensor& in, std::vector<int64_t>* rows) override {
    MX_RETURN_IF_ERROR(check_rows("all_gather_v", in));
    if (rows != nullptr) *rows = {in.dim(0)};
    return in;
  }
  Result<Tensor> reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& rows, ReduceOp) override {
    MX_RETURN_IF_ERROR(check_rows("reduce_scatter_v", in));
    if (rows.size() != 1 || rows[0] != in.dim(0))
      return invalid_argument("reduce_scatter_v: rows must name 1 rank with the " + std::to_string(in.dim(0)) +
                              " rows of " + in.describe());
    return in;
  }
  Result<Tensor> all_gather_columns(const Tensor& in) override {
    MX_RETURN_IF_ERROR(check_rows("all_gather_columns", in));
    return in;
  }
  Status barrier() override { return Status::ok(); }
  void abort(const Status&) override {}

 private:
  static Status check_defined(const char* op, const Tensor& t) {
    if (!t.defined()) return invalid_argument(std::string(op) + ": undefined tensor");
    return Status::ok();
  }
  static Status check_rows(const char* op, const Tensor& t) {
    MX_RETURN_IF_ERROR(check_defined(op, t));
    if (t.ndim() < 1) return invalid_argument(std::string(op) + ": needs a tensor with rows, got " + t.describe());
    return Status::ok();
  }

  RankLayout layout_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_single_rank_communicator(const RankLayout& layout) {
  if (layout.world() != 1)
    return unsupported("the single-rank communicator serves a world of 1, this layout has " +
                       std::to_string(layout.world()) + " ranks (multi-rank collectives are not built yet)");
  return std::unique_ptr<Communicator>(new SingleRankCommunicator(layout));
}

}  // namespace mxserve::parallel
