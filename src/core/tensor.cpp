#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/check.h"

namespace mxserve {

std::string Device::to_string() const {
  return type == DeviceType::kCPU ? "cpu" : "cuda:" + std::to_string(index);
}

std::string shape_to_string(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  for (int64_t d : shape) MX_CHECK_GE(d, 0);
  auto bytes = dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape)));
  MX_CHECK_MSG(bytes.has_value(), "fp4 tensor with an odd element count " << shape_to_string(shape));
  const uint64_t alloc = ((*bytes + 63) / 64) * 64 + 64;
  void* p = std::aligned_alloc(64, alloc);
  MX_CHECK_MSG(p != nullptr, "host allocation of " << alloc << " bytes failed");
  Tensor t;
  t.storage_ = std::make_shared<Storage>(p, *bytes, Device::cpu(), [](void* q) { std::free(q); });
  t.data_ = p;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::view_of(void* data, DType dtype, Shape shape, Device device) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  t.device_ = device;
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape) {
  Tensor t;
  t.data_ = storage->data();
  t.device_ = storage->device();
  t.storage_ = std::move(storage);
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  MX_CHECK_LE(t.nbytes(), t.storage_->bytes());
  return t;
}

uint64_t Tensor::nbytes() const {
  auto b = dtype_bytes(dtype_, static_cast<uint64_t>(numel()));
  return b.value_or(0);
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MX_CHECK(ndim() >= 1);
  MX_CHECK(0 <= begin && begin <= end && end <= shape_[0]);
  MX_CHECK_MSG(dtype_bits(dtype_) >= 8 || (strides_[0] * begin) % 2 == 0, "fp4 slice at an odd element");
  Tensor t = *this;
  t.shape_[0] = end - begin;
  const int64_t elem_offset = begin * strides_[0];
  t.data_ = static_cast<char*>(data_) + (elem_offset * dtype_bits(dtype_)) / 8;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  MX_CHECK_MSG(is_contiguous(), "reshape of a non-contiguous tensor " << describe());
  MX_CHECK_MSG(shape_numel(shape) == numel(), "reshape " << describe() << " to " << shape_to_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_to_string(shape_); }

}  // namespace mxserve
