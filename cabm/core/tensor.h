// A small strided tensor: shape, strides (in elements), dtype, and a reference-counted,
// 64-byte aligned buffer. Views (slices, reshapes, head splits) share the buffer; nothing
// here copies unless its name says so (clone, contiguous).
#pragma once

#include "cabm/core/dtype.h"
#include "cabm/core/error.h"

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace cabm {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[2, 3, 4]"
// Element count; a negative size, or sizes whose product (of the non-zero ones) overflows int64,
// is a cabm::Error naming the shape.
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

// An aligned allocation. Buffers of 2 MiB or more are advised to use transparent huge pages,
// because first-touch page faults dominate large fresh allocations on our machines.
class Storage {
 public:
  explicit Storage(size_t bytes);
  // Memory the caller owns: used in place, never freed here.
  struct External {};
  Storage(External, void* data, size_t bytes) : data_(data), bytes_(bytes), owned_(false) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool owned() const { return owned_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool owned_ = true;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype = DType::F32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  static Tensor full(const Shape& shape, float value);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  // A view of memory the caller owns (no copy): element [i0, i1, ...] is at
  // data + Σ i_k · strides[k] elements (strides default to contiguous, row-major). The caller
  // keeps the memory alive and unchanged in size while this tensor or any view of it exists.
  // This is how a program hands its own buffers to the kernels (attention_forward etc.).
  static Tensor from_external(void* data, const Shape& shape, DType dtype = DType::F32, const Shape& strides = {});

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const { return shape_[wrap_axis(axis)]; }
  int64_t stride(int64_t axis) const { return strides_[wrap_axis(axis)]; }
  int64_t numel() const { return shape_numel(shape_); }
  bool is_contiguous() const;

  // Typed pointer to element [0, ..., 0]; checks the dtype.
  template <typename T>
  T* data() const {
    CABM_CHECK(storage_ != nullptr, "tensor is undefined");
    check_dtype_for(sizeof(T), dtype_of<T>());
    return reinterpret_cast<T*>(static_cast<char*>(storage_->data()) +
                                offset_ * static_cast<int64_t>(dtype_size(dtype_)));
  }
  void* raw_data() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  // Views.
  Tensor view(const Shape& shape) const;  // contiguous only; one dim may be -1
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t extra_offset = 0) const;
  Tensor narrow(int64_t axis, int64_t start, int64_t length) const;
  Tensor select(int64_t axis, int64_t index) const;  // drops the axis

  // Copies.
  Tensor clone() const;       // contiguous copy
  Tensor contiguous() const;  // this if already contiguous, else a copy
  void copy_from(const Tensor& src);  // same shape and dtype, any strides
  void fill(float value);             // F32 only

  // Element access for tests and boundary code (slow; not for kernels).
  float at(std::initializer_list<int64_t> index) const;
  std::vector<float> to_vector() const;  // F32 or BF16 → float, in logical order

  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // ensure_shape's reuse: when this tensor alone holds its (owned) storage and `shape` of
  // `dtype` fits in it, becomes that contiguous tensor in place (contents unspecified, as
  // Tensor::empty's) and returns true; otherwise changes nothing and returns false.
  bool reuse_storage(const Shape& shape, DType dtype);

 private:
  template <typename T>
  static constexpr DType dtype_of();
  void check_dtype_for(size_t element_size, DType expected) const;
  int64_t wrap_axis(int64_t axis) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
};

template <typename T>
constexpr DType Tensor::dtype_of() {
  if constexpr (std::is_same_v<std::remove_const_t<T>, float>) return DType::F32;
  else if constexpr (std::is_same_v<std::remove_const_t<T>, bf16>) return DType::BF16;
  else if constexpr (std::is_same_v<std::remove_const_t<T>, uint8_t>) return DType::BOOL;
  else if constexpr (std::is_same_v<std::remove_const_t<T>, int64_t>) return DType::I64;
  else static_assert(sizeof(T) == 0, "unsupported element type");
}

// Makes `t` a contiguous tensor of `shape` and `dtype` (contents unspecified when either
// changed), reallocating only when its storage is too small or shared: workspaces and saved
// activations are allocated once for the largest shape, not once per call or per shape.
// (Inference meets a new shape with nearly every batch of texts; fresh memory costs a page
// fault per 4 KiB here: `cabm embed` spent 9% of its time in the kernel clearing new pages.)
void ensure_shape(Tensor& t, const Shape& shape, DType dtype = DType::F32);

}  // namespace cabm
