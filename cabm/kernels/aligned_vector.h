// std::vector whose storage starts on a 64-byte boundary: one cache line, one zmm register, one
// row of an AMX tile. Internal to cabm/kernels/.
//
// Why: glibc's malloc aligns to 16 bytes, so a std::vector<float> of tile rows starts at 16, 32 or
// 48 bytes into a line as often as at 0, and then every 64-byte row of an AMX tile load or store
// and every zmm load touches two lines. The bf16 attention kernels keep their per-thread tiles
// (S, P, O, Q, the mask; every buffer of the backward) in such vectors; aligned, the AMX backward
// ran 1.4–1.8× and the AMX forward 5–10% faster on an Intel Xeon at N 4096 (docs/amx_attention.md,
// session 31).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace cabm::detail {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};

  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}  // NOLINT: rebinding, as std::allocator

  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  // The unsized form: clang declares the sized one only with -fsized-deallocation.
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, kAlignment); }

  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;  // stateless: any instance frees what another allocated
  }
};

template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace cabm::detail
