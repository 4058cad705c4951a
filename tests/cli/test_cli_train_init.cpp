// `cabm train --init FILE`: starting from the weights of a safetensors file with the model's
// PyTorch names — a plain state_dict whose shapes match the flags, or a cabm model file whose
// metadata supplies the architecture flags not given — and the bad cases (missing file, missing
// tensor, shapes that contradict the flags): one line each, naming the file or tensor.
#include "cabm/io/safetensors.h"
#include "cabm/interop/state_dict.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <fstream>

namespace cabm {
namespace {

using test::CmdResult;

const std::string kFlags = " --layers 1 --heads 2 --d-model 16 --d-ff 32 --seq-len 16 --batch-size 4";

std::string data_file() {
  const std::string path = test::temp_dir() + "/text.txt";
  std::ofstream out(path);
  for (int i = 0; i < 40; ++i) out << "Line " << i << ": pack my box with five dozen liquor jugs.\n";
  return path;
}

// The twin of kFlags' model (V 256, T 16, E 16, H 2, L 1, F 32, pre-norm, GELU, tied head) with
// random weights, as a state_dict without metadata.
std::map<std::string, Tensor> random_state_dict() {
  CausalLMConfig config;
  std::tie(config.vocab_size, config.max_seq_len, config.d_model, config.nhead, config.num_layers,
           config.dim_feedforward) = std::tuple(256, 16, 16, 2, 1, 32);
  CausalLM model = make_causal_lm(config);
  uint64_t seed = 100;
  for (const NamedTensor& p : named_parameters(model)) {
    Tensor t = p.tensor;  // a handle on the parameter's storage
    t.copy_from(test::random_tensor(t.shape(), seed++));
  }
  return to_tensor_map(named_parameters(model));
}

TEST(CliTrainInit, StartsFromAPlainStateDict) {
  const std::string dir = test::temp_dir();
  const auto weights = random_state_dict();
  write_safetensors(dir + "/init.safetensors", weights, {});
  // One step at lr 1e-12 without weight decay moves no weight by more than ~1e-12: the saved
  // model must be the file's weights, not a fresh initialisation.
  const CmdResult r = test::run_cabm("train --data " + data_file() + kFlags + " --init " + dir +
                                     "/init.safetensors --steps 1 --warmup 1 --lr 1e-12 --weight-decay 0"
                                     " --sample-tokens 0 --out " + dir + "/run");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const SafetensorsFile saved = read_safetensors(dir + "/run/step-00000001/model.safetensors");
  for (const auto& [name, tensor] : weights) {
    SCOPED_TRACE(name);
    EXPECT_CLOSE(saved.get(name), tensor, 0.0, 1e-6);
  }
}

TEST(CliTrainInit, CabmModelFileSuppliesTheArchitecture) {
  const std::string dir = test::temp_dir();
  const CmdResult first = test::run_cabm("train --data " + data_file() + kFlags +
                                         " --steps 2 --sample-tokens 0 --out " + dir + "/first");
  ASSERT_EQ(first.status, 0) << first.err;
  // No architecture flags: 1 layer, E 16, 2 heads, F 32 come from the file's metadata.
  const CmdResult second = test::run_cabm("train --data " + data_file() + " --init " + dir +
                                          "/first/step-00000002/model.safetensors --steps 1 --batch-size 4"
                                          " --sample-tokens 0 --out " + dir + "/second");
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_NE(second.out.find("1 layers, d_model 16, 2 heads, d_ff 32"), std::string::npos) << second.out;
}

TEST(CliTrainInit, BadFilesAreOneLine) {
  const std::string dir = test::temp_dir();
  const std::string train = "train --data " + data_file() + " --steps 1 --out " + dir + "/bad-run --init ";
  test::expect_one_line_error(test::run_cabm(train + dir + "/absent.safetensors" + kFlags), "absent.safetensors");

  auto weights = random_state_dict();
  weights.erase("encoder.layers.0.linear1.weight");
  write_safetensors(dir + "/partial.safetensors", weights, {});
  test::expect_one_line_error(test::run_cabm(train + dir + "/partial.safetensors" + kFlags),
                              "encoder.layers.0.linear1.weight");

  write_safetensors(dir + "/full.safetensors", random_state_dict(), {});
  // The flags say F = 64; the file's linear1.weight is [32, 16].
  test::expect_one_line_error(
      test::run_cabm(train + dir + "/full.safetensors --layers 1 --heads 2 --d-model 16 --d-ff 64 --seq-len 16"),
      "linear1.weight");
}

}  // namespace
}  // namespace cabm
