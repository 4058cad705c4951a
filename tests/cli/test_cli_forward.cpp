// `cabm forward` with bad input: every case is one clear line on stderr naming the file, the
// tensor or the metadata key, and a non-zero exit — never a crash or a silent result.
#include "cabm/io/safetensors.h"
#include "cabm/interop/state_dict.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

namespace cabm {
namespace {

using test::CmdResult;

CmdResult run_forward(const std::string& model, const std::string& input, const std::string& output,
                      const std::string& extra = "") {
  return test::run_cabm("forward --model '" + model + "' --input '" + input + "' --output '" + output + "' " + extra);
}

std::string path(const std::string& name) { return test::temp_dir() + "/" + name; }

// A valid TransformerEncoderLayer (E = 8, H = 2, F = 16) and its input.
struct Files {
  std::map<std::string, Tensor> model;
  std::map<std::string, std::string> model_meta{{"module", "TransformerEncoderLayer"}, {"nhead", "2"}};
  std::map<std::string, Tensor> input{{"src", test::random_tensor({2, 5, 8}, 3)}};
  std::map<std::string, std::string> input_meta;

  Files() {
    EncoderLayer layer = make_encoder_layer({8, 2, 16, 0.0f});
    uint64_t seed = 10;
    for (const NamedTensor& p : named_parameters(layer)) {
      Tensor t = p.tensor;
      t.copy_from(test::random_tensor(t.shape(), seed++));
    }
    model = to_tensor_map(named_parameters(layer));
  }
  CmdResult run(const std::string& extra = "") {
    write_safetensors(path("model.safetensors"), model, model_meta);
    write_safetensors(path("input.safetensors"), input, input_meta);
    return run_forward(path("model.safetensors"), path("input.safetensors"), path("out.safetensors"), extra);
  }
};

void expect_error(const CmdResult& r, const std::string& needle) { test::expect_one_line_error(r, needle); }

TEST(CliForward, ValidFilesRun) {
  Files f;
  const CmdResult r = f.run();
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_safetensors(path("out.safetensors")).get("output").shape(), (Shape{2, 5, 8}));
}

TEST(CliForward, MissingFiles) {
  expect_error(run_forward(path("nope.safetensors"), path("nope2.safetensors"), path("o.safetensors")),
               "nope.safetensors");
  Files f;
  f.run();
  expect_error(run_forward(path("model.safetensors"), path("absent_input.safetensors"), path("o.safetensors")),
               "absent_input.safetensors");
  expect_error(run_forward(path("model.safetensors"), path("input.safetensors"), "/nonexistent-dir/o.safetensors"),
               "/nonexistent-dir/o.safetensors");
}

TEST(CliForward, MissingKey) {
  Files f;
  f.model.erase("linear2.bias");
  expect_error(f.run(), "linear2.bias");
}

TEST(CliForward, WrongShape) {
  Files f;
  f.model["norm1.weight"] = Tensor::zeros({7});
  expect_error(f.run(), "norm1.weight");
}

TEST(CliForward, UnexpectedKey) {
  Files f;
  f.model["extra.weight"] = Tensor::zeros({2});
  expect_error(f.run(), "extra.weight");
}

TEST(CliForward, BadMetadata) {
  {
    Files f;
    f.model_meta.erase("nhead");
    expect_error(f.run(), "nhead");
  }
  {
    Files f;
    f.model_meta["nhead"] = "3";  // does not divide 8
    expect_error(f.run(), "divisible");
  }
  {
    Files f;
    f.model_meta["nhead"] = "two";
    expect_error(f.run(), "nhead");
  }
  {
    Files f;
    f.model_meta["activation"] = "tanh";
    expect_error(f.run(), "activation");
  }
  {
    Files f;
    f.model_meta["norm_first"] = "maybe";
    expect_error(f.run(), "norm_first");
  }
  {
    Files f;
    f.model_meta["layer_norm_eps"] = "small";
    expect_error(f.run(), "layer_norm_eps");
  }
  {
    Files f;
    f.model_meta["module"] = "TransformerDecoder";
    expect_error(f.run(), "module");
  }
  {
    Files f;
    f.input_meta["is_causal"] = "yes please";
    expect_error(f.run(), "is_causal");
  }
}

TEST(CliForward, BadInputs) {
  {
    Files f;
    f.input.erase("src");
    expect_error(f.run(), "src");
  }
  {
    Files f;
    f.input["src"] = test::random_tensor({2, 5, 9}, 1);
    expect_error(f.run(), "src");
  }
  {
    Files f;
    f.input["src"] = Tensor::zeros({2, 5, 8}, DType::I64);
    expect_error(f.run(), "src");
  }
  {
    Files f;
    f.input["mask"] = Tensor::zeros({5, 4}, DType::BOOL);
    expect_error(f.run(), "mask");
  }
  {
    Files f;
    f.input["mask"] = Tensor::zeros({5, 5}, DType::I64);
    expect_error(f.run(), "mask");
  }
  {
    Files f;
    f.input["src_key_padding_mask"] = Tensor::zeros({3, 5}, DType::BOOL);
    expect_error(f.run(), "src_key_padding_mask");
  }
}

// A NaN or ±inf weight made every output NaN with exit 0: refused, naming the file and tensor.
// NaN in the input is the user's data, which PyTorch propagates: so does cabm, with exit 0.
TEST(CliForward, NonFiniteWeightsAreRefusedNonFiniteInputsPropagate) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, float>>{
           {"self_attn.in_proj_weight", std::nanf("")}, {"linear1.bias", std::numeric_limits<float>::infinity()}}) {
    Files f;
    f.model[key].data<float>()[4] = value;
    expect_error(f.run(), fmt::format("model.safetensors: tensor '{}' holds {} at element 4", key, value));
  }
  Files f;
  f.input["src"].data<float>()[0] = std::nanf("");
  const CmdResult r = f.run();
  ASSERT_EQ(r.status, 0) << r.err;
  const Tensor out = read_safetensors(path("out.safetensors")).get("output");
  EXPECT_TRUE(std::isnan(out.at({0, 0, 0})));
  EXPECT_FALSE(std::isnan(out.at({1, 0, 0})));  // the other sequence never sees it
}

TEST(CliForward, BadFlags) {
  Files f;
  f.run();
  const CmdResult r = run_forward(path("model.safetensors"), path("input.safetensors"), path("o.safetensors"), "--threads 0");
  EXPECT_NE(r.status, 0);
  const CmdResult r2 = run_forward(path("model.safetensors"), path("input.safetensors"), path("o.safetensors"), "--bogus");
  EXPECT_NE(r2.status, 0);
}

TEST(CliForward, MalformedModelFile) {
  std::ofstream(path("garbage.safetensors")) << "this is not a safetensors file at all";
  Files f;
  f.run();
  expect_error(run_forward(path("garbage.safetensors"), path("input.safetensors"), path("o.safetensors")),
               "garbage.safetensors");
}

}  // namespace
}  // namespace cabm
