// Loading parameters by state_dict name (cabm/interop/state_dict.h): the finiteness scan that every
// loader of model weights runs, and load_parameters (`cabm forward`, checkpoints, --init) refusing
// a NaN or ±inf weight with one line naming the file and the tensor (issue 16: a model file whose
// weights hold NaN loaded, and every output was NaN with exit 0).
#include "cabm/interop/state_dict.h"
#include "util/test_util.h"

#include <limits>

namespace cabm {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor to_bf16(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::BF16);
  const float* src = t.data<float>();
  bf16* dst = out.data<bf16>();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = float_to_bf16(src[i]);
  return out;
}

TEST(FindNonFinite, FirstIndexInEveryBlockPosition) {
  // The scan works in blocks of 4096: a bad element at a block's first and last place, past
  // the last whole block, and the first of two.
  const int64_t n = 3 * 4096 + 17;
  for (const int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{3 * 4096 + 16}})
    for (const float bad : {kNan, -kNan, kInf, -kInf}) {
      Tensor t = test::random_tensor({n}, 1, -1e3f, 1e3f);
      t.data<float>()[at] = bad;
      EXPECT_EQ(find_non_finite(t), at) << at << " " << bad;
      EXPECT_EQ(find_non_finite(to_bf16(t)), at) << at << " " << bad;
      t.data<float>()[n - 1] = kNan;
      EXPECT_EQ(find_non_finite(t), at) << "the first one";
    }
}

TEST(FindNonFinite, ExtremeFiniteValuesAreFinite) {
  const float max = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
  const Tensor t = Tensor::from_vector({max, -max, tiny, -tiny, 0.0f, -0.0f, 1.0f}, {7});
  EXPECT_EQ(find_non_finite(t), -1);
  EXPECT_EQ(find_non_finite(Tensor::from_vector({-max, -tiny}, {2})), -1);
  EXPECT_EQ(find_non_finite(Tensor::zeros({0})), -1);
  // The largest finite bf16 (0x7f7f) is finite; 0x7f80 is +inf, 0xff81 a NaN.
  Tensor b = Tensor::empty({3}, DType::BF16);
  b.data<bf16>()[0] = bf16{0x7f7f};
  b.data<bf16>()[1] = bf16{0xff7f};
  b.data<bf16>()[2] = bf16{0x0001};
  EXPECT_EQ(find_non_finite(b), -1);
  b.data<bf16>()[2] = bf16{0x7f80};
  EXPECT_EQ(find_non_finite(b), 2);
  b.data<bf16>()[1] = bf16{0xff81};
  EXPECT_EQ(find_non_finite(b), 1);
  // Integer tensors hold no NaN; a strided view is scanned in logical order.
  EXPECT_EQ(find_non_finite(Tensor::zeros({4}, DType::I64)), -1);
  Tensor m = Tensor::zeros({3, 4});
  m.data<float>()[1 * 4 + 2] = kInf;  // [1, 2]: element 2·3 + 1 = 7 of the transpose
  EXPECT_EQ(find_non_finite(m.as_strided({4, 3}, {1, 4})), 7);
}

// A TransformerEncoderLayer's state_dict (what `cabm forward` loads) with one weight damaged.
struct LayerFile {
  EncoderLayer layer = make_encoder_layer({8, 2, 16, 0.0f});
  std::map<std::string, Tensor> tensors;
  std::string path = test::temp_dir() + "/layer.safetensors";

  LayerFile() {
    uint64_t seed = 10;
    for (const NamedTensor& p : named_parameters(layer))
      tensors[p.name] = test::random_tensor(p.tensor.shape(), seed++);
  }
  std::string load_error() {
    write_safetensors(path, tensors);
    EncoderLayer fresh = make_encoder_layer({8, 2, 16, 0.0f});
    return test::error_of([&] { load_parameters(read_safetensors(path), named_parameters(fresh)); });
  }
};

TEST(LoadParameters, NonFiniteWeightsAreRefusedNamingFileAndTensor) {
  {
    LayerFile f;
    EXPECT_EQ(f.load_error(), "");
  }
  struct Case {
    std::string key;
    int64_t element;
    float value;
    bool bf16;
    std::string shown;
  };
  const std::vector<Case> cases = {{"self_attn.in_proj_weight", 37, kNan, false, "nan"},
                                   {"linear2.bias", 7, kInf, false, "inf"},
                                   {"norm1.weight", 0, -kInf, false, "-inf"},
                                   {"linear1.weight", 100, kInf, true, "inf"},
                                   {"self_attn.out_proj.bias", 3, kNan, true, "nan"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    LayerFile f;
    f.tensors[c.key].data<float>()[c.element] = c.value;
    if (c.bf16) f.tensors[c.key] = to_bf16(f.tensors[c.key]);
    const std::string message = f.load_error();
    EXPECT_EQ(message, fmt::format("{}: tensor '{}' holds {} at element {} (a model's weights must be finite)", f.path,
                                   c.key, c.shown, c.element));
  }
}

}  // namespace
}  // namespace cabm
