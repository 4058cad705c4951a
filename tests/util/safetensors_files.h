// What the safetensors tests share (test_safetensors, test_safetensors_corruption): files in the
// test's temporary folder, byte-exact tensor comparison, and a set of tensors of every dtype.
#pragma once

#include "cabm/io/safetensors.h"
#include "util/test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string>

namespace cabm::test {

inline std::string temp_path(const std::string& name) {
  return test::temp_dir() + "/" + name;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void expect_same(const Tensor& actual, const Tensor& expected, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_EQ(actual.dtype(), expected.dtype());
  ASSERT_EQ(actual.shape(), expected.shape());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(actual.raw_data()) % 64, 0u);
  const Tensor e = expected.contiguous();
  EXPECT_EQ(std::memcmp(actual.raw_data(), e.raw_data(), e.nbytes()), 0);
}

inline std::map<std::string, Tensor> every_dtype() {
  std::map<std::string, Tensor> t;
  t["layers.0.linear1.weight"] = test::random_tensor({2, 3, 4}, 1);
  Tensor half = Tensor::empty({5, 7}, DType::BF16);
  const Tensor source = test::random_tensor({5, 7}, 2);
  for (int64_t i = 0; i < half.numel(); ++i) half.data<bf16>()[i] = float_to_bf16(source.data<float>()[i]);
  t["half"] = half;
  Tensor mask = Tensor::empty({3, 3}, DType::BOOL);
  for (int64_t i = 0; i < 9; ++i) mask.data<uint8_t>()[i] = static_cast<uint8_t>(i % 2);
  t["mask"] = mask;
  Tensor ids = Tensor::empty({4}, DType::I64);
  const int64_t id_values[] = {0, -1, (int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::min()};
  std::memcpy(ids.raw_data(), id_values, sizeof(id_values));
  t["ids"] = ids;
  t["scalar"] = Tensor::full({}, 3.5f);
  t["empty"] = Tensor::empty({0, 3});
  t["empty_ids"] = Tensor::empty({0}, DType::I64);
  t["empty_mask"] = Tensor::empty({2, 0}, DType::BOOL);
  return t;
}

}  // namespace cabm::test
