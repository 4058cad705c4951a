#include "cabm/core/tensor.h"

#include "cabm/core/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace cabm {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The product of the non-zero sizes must fit int64, zero sizes or not: contiguous_strides and
// every offset computation multiply them. A shape read from a file or built from a hostile
// config therefore fails here, never as a wrapped size.
int64_t shape_numel(const Shape& shape) {
  int64_t n = 1, nonzero = 1;
  for (int64_t s : shape) {
    if (s < 0) throw Error(fmt::format("negative size in shape {}", shape_str(shape)));
    if (s != 0 && __builtin_mul_overflow(nonzero, s, &nonzero))
      throw Error(fmt::format("shape {} has more than 2^63 elements", shape_str(shape)));
    n = s == 0 ? 0 : n * s;  // cannot overflow: |n| <= nonzero
  }
  return n;
}

namespace {

// More than x86-64's 47-bit user address space: no machine can hold it, so asking is a bug or
// a hostile shape, reported as such rather than as "out of memory".
constexpr size_t kMaxAllocation = size_t{1} << 47;

}  // namespace

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

Storage::Storage(size_t bytes) : bytes_(bytes) {
  constexpr size_t kAlign = 64;
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes > kMaxAllocation)
    throw Error(fmt::format("allocation of {} bytes is larger than any machine's address space", bytes));
  const size_t align = bytes >= kHuge ? kHuge : kAlign;
  const size_t rounded = (bytes + align - 1) / align * align;
  data_ = std::aligned_alloc(align, rounded ? rounded : align);
  if (data_ == nullptr)
    throw OutOfMemory(
        fmt::format("out of memory allocating {} ({} bytes)", human_bytes(static_cast<double>(bytes)), bytes));
  if (bytes >= kHuge) madvise(data_, rounded, MADV_HUGEPAGE);
}

Storage::~Storage() {
  if (owned_) std::free(data_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t s : shape) CABM_CHECK(s >= 0, "negative size in shape {}", shape_str(shape));
  // The one place shapes become bytes: checked, so that a huge shape is an error, not a small
  // wrapped allocation that later code clears or fills as if it were the whole tensor.
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)), dtype_size(dtype), &bytes) ||
      bytes > kMaxAllocation)
    throw Error(fmt::format("a {} {} tensor is larger than any machine's address space", shape_str(shape),
                            dtype_name(dtype)));
  Tensor t;
  try {
    t.storage_ = std::make_shared<Storage>(bytes);
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(fmt::format("{} for a {} {} tensor", e.what(), shape_str(shape), dtype_name(dtype)));
  } catch (const std::bad_alloc&) {  // the control block
    throw OutOfMemory(fmt::format("out of memory allocating a {} {} tensor", shape_str(shape), dtype_name(dtype)));
  }
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.storage_->data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::F32);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  CABM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "{} values do not fill shape {}", values.size(), shape_str(shape));
  Tensor t = empty(shape, DType::F32);
  std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_external(void* data, const Shape& shape, DType dtype, const Shape& strides) {
  CABM_CHECK(data != nullptr, "from_external: null data pointer for shape {}", shape_str(shape));
  for (int64_t s : shape) CABM_CHECK(s >= 0, "from_external: negative size in shape {}", shape_str(shape));
  const Shape st = strides.empty() ? contiguous_strides(shape) : strides;
  CABM_CHECK(st.size() == shape.size(), "from_external: shape {} and strides {} differ in rank", shape_str(shape),
             shape_str(st));
  int64_t extent = 1;  // elements from the first to one past the last addressed
  for (size_t i = 0; i < shape.size(); ++i) {
    CABM_CHECK(st[i] >= 0, "from_external: negative stride in {}", shape_str(st));
    if (shape[i] == 0) extent = 0;
  }
  if (extent != 0)
    for (size_t i = 0; i < shape.size(); ++i) extent += (shape[i] - 1) * st[i];
  Tensor t;
  t.storage_ = std::make_shared<Storage>(Storage::External{}, data, static_cast<size_t>(extent) * dtype_size(dtype));
  t.shape_ = shape;
  t.strides_ = st;
  t.dtype_ = dtype;
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  CABM_CHECK(storage_ != nullptr, "tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

void Tensor::check_dtype_for(size_t element_size, DType expected) const {
  CABM_CHECK(dtype_ == expected && element_size == dtype_size(dtype_),
             "tensor has dtype {}, accessed as {}", dtype_name(dtype_), dtype_name(expected));
}

int64_t Tensor::wrap_axis(int64_t axis) const {
  const int64_t n = dim();
  CABM_CHECK(axis >= -n && axis < n, "axis {} out of range for a {}-d tensor", axis, n);
  return axis < 0 ? axis + n : axis;
}

Tensor Tensor::view(const Shape& shape) const {
  CABM_CHECK(is_contiguous(), "view of a non-contiguous tensor {}", shape_str(shape_));
  Shape resolved = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      CABM_CHECK(infer < 0, "view shape {} has more than one -1", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= resolved[i];
    }
  }
  if (infer >= 0) {
    CABM_CHECK(known > 0 && numel() % known == 0, "cannot view {} as {}", shape_str(shape_), shape_str(shape));
    resolved[infer] = numel() / known;
  }
  CABM_CHECK(shape_numel(resolved) == numel(), "cannot view {} as {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = resolved;
  t.strides_ = contiguous_strides(resolved);
  return t;
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t extra_offset) const {
  CABM_CHECK(shape.size() == strides.size(), "shape {} and strides {} differ in rank", shape_str(shape),
             shape_str(strides));
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = strides;
  t.offset_ += extra_offset;
  return t;
}

Tensor Tensor::narrow(int64_t axis, int64_t start, int64_t length) const {
  const int64_t a = wrap_axis(axis);
  CABM_CHECK(start >= 0 && length >= 0 && start + length <= shape_[a], "narrow [{}, {}) out of range {} on axis {}",
             start, start + length, shape_[a], axis);
  Tensor t = *this;
  t.offset_ += start * strides_[a];
  t.shape_[a] = length;
  return t;
}

Tensor Tensor::select(int64_t axis, int64_t index) const {
  const int64_t a = wrap_axis(axis);
  CABM_CHECK(index >= 0 && index < shape_[a], "index {} out of range {} on axis {}", index, shape_[a], axis);
  Tensor t = *this;
  t.offset_ += index * strides_[a];
  t.shape_.erase(t.shape_.begin() + a);
  t.strides_.erase(t.strides_.begin() + a);
  return t;
}

namespace {
// Calls fn(dst_offset, src_offset) in elements for every index of `shape`, row-major.
template <typename Fn>
void for_each_index(const Shape& shape, const Shape& a_strides, const Shape& b_strides, Fn fn) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  const size_t rank = shape.size();
  std::vector<int64_t> index(rank, 0);
  int64_t a = 0, b = 0;
  for (int64_t count = 0; count < n; ++count) {
    fn(a, b);
    for (size_t i = rank; i-- > 0;) {
      if (++index[i] < shape[i]) {
        a += a_strides[i];
        b += b_strides[i];
        break;
      }
      a -= a_strides[i] * (shape[i] - 1);
      b -= b_strides[i] * (shape[i] - 1);
      index[i] = 0;
    }
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  CABM_CHECK(src.shape_ == shape_, "copy from {} into {}", shape_str(src.shape_), shape_str(shape_));
  CABM_CHECK(src.dtype_ == dtype_, "copy from {} into {}", dtype_name(src.dtype_), dtype_name(dtype_));
  const size_t es = dtype_size(dtype_);
  if (is_contiguous() && src.is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  char* dst = static_cast<char*>(raw_data());
  const char* from = static_cast<const char*>(src.raw_data());
  for_each_index(shape_, strides_, src.strides_, [&](int64_t d, int64_t s) {
    std::memcpy(dst + d * static_cast<int64_t>(es), from + s * static_cast<int64_t>(es), es);
  });
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

void Tensor::fill(float value) {
  float* p = data<float>();
  for_each_index(shape_, strides_, strides_, [&](int64_t d, int64_t) { p[d] = value; });
}

float Tensor::at(std::initializer_list<int64_t> index) const {
  CABM_CHECK(static_cast<int64_t>(index.size()) == dim(), "index of rank {} into a {}-d tensor", index.size(), dim());
  int64_t offset = 0, axis = 0;
  for (int64_t i : index) {
    CABM_CHECK(i >= 0 && i < shape_[axis], "index {} out of range {} on axis {}", i, shape_[axis], axis);
    offset += i * strides_[axis++];
  }
  switch (dtype_) {
    case DType::F32: return data<float>()[offset];
    case DType::BF16: return bf16_to_float(data<bf16>()[offset]);
    case DType::BOOL: return data<uint8_t>()[offset];
    case DType::I64: return static_cast<float>(data<int64_t>()[offset]);
  }
  return 0;
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(numel()));
  const char* base = static_cast<const char*>(raw_data());
  const int64_t es = static_cast<int64_t>(dtype_size(dtype_));
  for_each_index(shape_, strides_, strides_, [&](int64_t d, int64_t) {
    const char* p = base + d * es;
    switch (dtype_) {
      case DType::F32: out.push_back(*reinterpret_cast<const float*>(p)); break;
      case DType::BF16: out.push_back(bf16_to_float(*reinterpret_cast<const bf16*>(p))); break;
      case DType::BOOL: out.push_back(static_cast<float>(*reinterpret_cast<const uint8_t*>(p))); break;
      case DType::I64: out.push_back(static_cast<float>(*reinterpret_cast<const int64_t*>(p))); break;
    }
  });
  return out;
}

void ensure_shape(Tensor& t, const Shape& shape, DType dtype) {
  if (t.defined() && t.shape() == shape && t.dtype() == dtype && t.is_contiguous()) return;
  if (t.reuse_storage(shape, dtype)) return;
  t = Tensor::empty(shape, dtype);
}

bool Tensor::reuse_storage(const Shape& shape, DType dtype) {
  // Only storage nothing else can see: no other tensor (view) shares it, and it is cabm's own.
  if (storage_ == nullptr || storage_.use_count() != 1 || !storage_->owned()) return false;
  for (int64_t s : shape)
    if (s < 0) return false;  // Tensor::empty reports it
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)), dtype_size(dtype), &bytes) ||
      bytes > storage_->bytes())
    return false;
  offset_ = 0;
  shape_ = shape;
  strides_ = contiguous_strides(shape);
  dtype_ = dtype;
  return true;
}

}  // namespace cabm
