// WeightLoader's rank slicing (weight_loader.h): a declared weight this rank holds part of (its ShardSlice,
// recorded by declare()) is read as that part only -- a host copy of the slice for checkpoint weights, the
// same generator window for synthetic ones (so every rank's slice holds the values of the one-rank model).
// Invariant: a sliced weight has the rank-local shape everywhere in the loader (shapes, stacks, fills).
#include <cstring>

#include "core/check.h"
#include "io/mapped_read.h"
#include "quant/mxfp4.h"
#include "model/layers/weight_loader.h"
#include "model/synthetic_weights.h"

namespace mxserve::model {

const parallel::ShardSlice* WeightLoader::slice_of(const std::string& name) const {
  const auto it = slices_.find(name);
  return it == slices_.end() ? nullptr : &it->second;
}

Shape WeightLoader::local_shape(const std::string& name) const {
  const parallel::ShardSlice* slice = slice_of(name);
  return slice == nullptr ? weights_.at(name).shape() : slice->local_shape;
}

// Dims [begin, end) along slice.dim of a contiguous host tensor, as a new contiguous host tensor.
Tensor WeightLoader::copy_slice(const Tensor& host, const parallel::ShardSlice& slice) {
  MX_CHECK(host.is_contiguous() && slice.dim >= 0 && slice.dim < host.ndim());
  const int64_t esize = dtype_bits(host.dtype()) / 8;
  // outer x [n along dim] x inner: copy the [begin, end) window of every outer row.
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < slice.dim; ++d) outer *= host.dim(d);
  for (int d = slice.dim + 1; d < host.ndim(); ++d) inner *= host.dim(d);
  const int64_t n = host.dim(slice.dim), width = slice.end - slice.begin;
  MX_CHECK(0 <= slice.begin && slice.begin < slice.end && slice.end <= n);
  Tensor out = Tensor::empty(host.dtype(), slice.local_shape);
  MX_CHECK_EQ(out.numel(), outer * width * inner);
  // pread from the checkpoint file when host is a view of one (io/mapped_read.h): no page outside the slice
  // is mapped into the process.
  io::read_strided(out.raw(), static_cast<const char*>(host.raw()) + slice.begin * inner * esize,
                   width * inner * esize, n * inner * esize, outer);
  return out;
}

namespace {

parallel::ShardSlice window_of(const Tensor& t, int dim, int64_t begin, int64_t end) {
  parallel::ShardSlice s;
  s.dim = dim, s.begin = begin, s.end = end;
  s.local_shape = t.shape();
  s.local_shape[dim] = end - begin;
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// The slice [begin, end) along dim of a 2-D quantized weight, cut out of its packed data and scale (only
// their byte ranges are read) where the slice falls on the format's blocks; nullopt otherwise.
std::optional<quant::StoredWeight> WeightLoader::slice_stored(const quant::StoredWeight& w,
                                                              const parallel::ShardSlice& s) {
  using quant::Precision;
  if (w.shape.size() != 2 || s.dim < 0 || s.dim > 1 || w.data.ndim() != 2 || !w.data.is_contiguous() ||
      (w.scale.raw() != nullptr && !w.scale.is_contiguous()))
    return std::nullopt;
  const int64_t n = w.shape[s.dim], b = s.begin, e = s.end;
  auto aligned = [&](int64_t block) { return block > 0 && b % block == 0 && (e % block == 0 || e == n); };
  quant::StoredWeight out = w;
  out.shape[s.dim] = e - b;
  switch (w.precision) {
    case Precision::kMxfp4:  // data [out, in/2], scale [out, in/32]
      if (s.dim == 0) {
        out.data = copy_slice(w.data, window_of(w.data, 0, b, e));
        out.scale = copy_slice(w.scale, window_of(w.scale, 0, b, e));
      } else {
        if (!aligned(quant::kMxBlock) || w.data.dim(1) * 2 != n) return std::nullopt;
        out.data = copy_slice(w.data, window_of(w.data, 1, b / 2, e / 2));
        out.scale = copy_slice(w.scale, window_of(w.scale, 1, b / quant::kMxBlock, ceil_div(e, quant::kMxBlock)));
      }
      return out;
    case Precision::kFp8Block: {  // data [out, in], scale [ceil(out/br), ceil(in/bc)]
      const int64_t block = s.dim == 0 ? w.block_rows : w.block_cols;
      if (!aligned(block) || w.scale.ndim() != 2) return std::nullopt;
      out.data = copy_slice(w.data, window_of(w.data, s.dim, b, e));
      out.scale = copy_slice(w.scale, window_of(w.scale, s.dim, b / block, ceil_div(e, block)));
      return out;
    }
    case Precision::kFp8Channel:  // scale [out, 1] or [out]: rows follow a row slice, whole for a column slice
    case Precision::kFp8Tensor:   // one scale
      out.data = copy_slice(w.data, window_of(w.data, s.dim, b, e));
      if (w.precision == Precision::kFp8Channel && s.dim == 0) {
        if (w.scale.numel() != w.shape[0]) return std::nullopt;
        out.scale = copy_slice(w.scale, window_of(w.scale, 0, b, e));
      }
      return out;
    default:
      return std::nullopt;
  }
}

Tensor WeightLoader::rows_and_zero_row(const WeightSpec& w) {
  if (!declare(w)) return Tensor();
  const Shape shape = synthetic_ ? synthetic_shape(w.name) : local_shape(w.name);
  MX_CHECK_MSG(shape.size() == 2, w.name << ": rows_and_zero_row needs a 2-D weight");
  Tensor dst = alloc_counted(be_.weight_dtype(), {shape[0] + 1, shape[1]});
  Tensor rows = dst.slice_rows(0, shape[0]);
  if (synthetic_) {
    synthetic_fill(w.name, rows, 0, shape[1]);
  } else {
    be_.copy_weight(host_float(w.name), rows);
  }
  Tensor zero_row = dst.slice_rows(shape[0], shape[0] + 1);
  be_.copy_weight(Tensor::zeros(DType::kF32, {1, shape[1]}), zero_row);
  return dst;
}

kernels::SyntheticFill WeightLoader::synthetic_slice_params(const std::string& name,
                                                           const parallel::ShardSlice& slice) const {
  kernels::SyntheticFill p = synthetic_fill_params(*synthetic_, name);  // the logical [rows, src_cols]
  const bool rows_slice = slice.dim == 0 && slice.local_shape.size() == 2;
  if (rows_slice) {  // rows [begin, end), whole: logical element (begin + r) * src_cols + c
    p.col_offset = slice.begin * p.src_cols;
    p.rows = slice.end - slice.begin;
  } else {  // columns [begin, end) of every row (a 1-D tensor is one row)
    p.col_offset = slice.begin;
    p.cols = slice.end - slice.begin;
  }
  return p;
}

// An MXFP4 slice must cut the logical rows on 32-element block boundaries (the rank's blocks are then the
// one-rank model's blocks, bit for bit); the error names the weight, the window and the flag to change.
static void check_mxfp4_window(const std::string& name, const kernels::SyntheticFill& p) {
  MX_CHECK_MSG(p.cols % 32 == 0 && p.src_cols % 32 == 0 && p.col_offset % 32 == 0,
               "synthetic mxfp4 " << name << ": the rank's slice (" << p.cols << " of " << p.src_cols
                                  << " columns at " << p.col_offset % (p.src_cols > 0 ? p.src_cols : 1)
                                  << ") does not fall on 32-element MXFP4 blocks; choose a --tensor-parallel-size "
                                     "(or --enable-dp-attention world) that divides the width into multiples of 32");
}

void WeightLoader::synthetic_fill_slice(const std::string& name, const parallel::ShardSlice& slice, Tensor& dst) {
  const std::string scheme = synthetic_scheme(synthetic_->plan, name);
  MX_CHECK_MSG(scheme == "bf16" || scheme == "mxfp4",
               "synthetic " << name << ": rank slices of " << scheme
                            << " weights are not supported yet (use --quantization bf16 or mxfp4 with tp > 1)");
  kernels::SyntheticFill p = synthetic_slice_params(name, slice);
  if (scheme == "mxfp4") {  // the MXFP4 values of the rank's blocks, dequantized (exact in bf16 and f32)
    check_mxfp4_window(name, p);
    p.kind = kernels::SyntheticKind::kMxfp4Dequant;
  }
  MX_CHECK_MSG(dst.numel() == p.rows * p.cols, "synthetic " << name << ": slice into " << dst.describe());
  be_.fill_synthetic(p, dst, nullptr);
}

void WeightLoader::synthetic_fill_mxfp4(const std::string& name, Tensor& codes, Tensor& scales) {
  MX_CHECK_MSG(synthetic_scheme(synthetic_->plan, name) == "mxfp4", "synthetic experts: " << name << " is not mxfp4");
  const parallel::ShardSlice* slice = slice_of(name);
  kernels::SyntheticFill p = slice ? synthetic_slice_params(name, *slice) : synthetic_fill_params(*synthetic_, name);
  check_mxfp4_window(name, p);
  MX_CHECK_MSG(codes.numel() == p.rows * p.cols / 2 && scales.numel() == p.rows * p.cols / 32,
               "synthetic experts: " << name << " into " << codes.describe() << " / " << scales.describe());
  p.kind = kernels::SyntheticKind::kMxfp4;
  be_.fill_synthetic(p, codes, &scales);
}

}  // namespace mxserve::model
