// Counter-based random numbers: Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers:
// as easy as 1, 2, 3"). A value depends only on (seed, counter), so any thread can produce the
// random number for any element without shared state, and dropout masks are identical in
// forward and backward and for every thread count.
#pragma once

#include <array>
#include <cstdint>

namespace cabm {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter_hi, uint64_t counter_lo);

// Uniform float in [0, 1) with 24 random bits, for element `index` of stream `stream`.
inline float uniform_from_bits(uint32_t bits) { return static_cast<float>(bits >> 8) * 0x1p-24f; }

// Four uniforms for elements 4*block .. 4*block+3 of a stream.
inline std::array<float, 4> uniform4(uint64_t seed, uint64_t stream, uint64_t block) {
  const auto r = philox4x32(seed, stream, block);
  return {uniform_from_bits(r[0]), uniform_from_bits(r[1]), uniform_from_bits(r[2]), uniform_from_bits(r[3])};
}

inline float uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return uniform4(seed, stream, index >> 2)[index & 3];
}

// A small sequential generator on top of Philox for host-side sampling (shuffles, init,
// token sampling): its whole state is (seed, position), so it is trivially checkpointed.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t position = 0) : seed_(seed), position_(position) {}
  float next_uniform() { return uniform(seed_, kHostStream, position_++); }
  uint32_t next_u32() {
    const uint64_t p = position_++;
    return philox4x32(seed_, kHostStream, p / 4)[p & 3];
  }
  float next_normal();  // Box-Muller
  uint64_t seed() const { return seed_; }
  uint64_t position() const { return position_; }

 private:
  static constexpr uint64_t kHostStream = 0xC0FFEEull << 32;
  uint64_t seed_;
  uint64_t position_;
};

}  // namespace cabm
