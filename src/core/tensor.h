// Tensor: a typed, shaped, strided window onto memory on one device, owning (shared storage) or a view.
// Owns: shape/stride/dtype bookkeeping and host allocation. Does not own: device allocation (a backend
// creates device Storage and wraps it with Tensor::from_storage) or any math.
// Invariants: strides are in elements; fp4_e2m1 tensors are contiguous (two elements per byte).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mxserve {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;
};

// A block of memory with a deleter; shared by tensors viewing it.
class Storage {
 public:
  Storage(void* data, uint64_t bytes, Device device, std::function<void(void*)> deleter)
      : data_(data), bytes_(bytes), device_(device), deleter_(std::move(deleter)) {}
  ~Storage() {
    if (deleter_) deleter_(data_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  uint64_t bytes_;
  Device device_;
  std::function<void(void*)> deleter_;
};

using Shape = std::vector<int64_t>;

std::string shape_to_string(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Host allocation, 64-byte aligned, uninitialized / zero-filled.
  static Tensor empty(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  // Non-owning view of external memory (mmap, a caller's buffer). Contiguous.
  static Tensor view_of(void* data, DType dtype, Shape shape, Device device = Device::cpu());
  // Wraps device storage made by a backend. Contiguous.
  static Tensor from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  uint64_t nbytes() const;
  Device device() const { return device_; }
  bool is_contiguous() const;

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Rows [begin, end) along dim 0, as a view (shares storage).
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same data, new shape with the same numel; contiguous tensors only.
  Tensor reshape(Shape shape) const;

  std::string describe() const;  // "bf16[4096, 128]"

 private:
  std::shared_ptr<Storage> storage_;  // null for views of external memory
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  Device device_;
};

Shape contiguous_strides(const Shape& shape);

}  // namespace mxserve
