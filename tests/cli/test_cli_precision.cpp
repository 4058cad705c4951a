// `--precision` on the command line: `cabm train --precision bf16` (recorded in state.json, kept
// by --resume), `cabm generate --precision bf16`, `cabm forward --precision bf16` against fp32,
// the fp32 default unchanged, and bad values as one-line errors.
#include "cabm/io/safetensors.h"
#include "cabm/interop/state_dict.h"
#include "cabm/nn/init.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace cabm {
namespace {

namespace fs = std::filesystem;

using test::CmdResult;
using test::expect_one_line_error;

CmdResult cabm(const std::string& args) {
  return test::run_cabm(args);
}


std::string data_file() {
  const std::string path = test::temp_dir() + "/text.txt";
  if (!fs::exists(path)) {
    std::ofstream out(path);
    for (int i = 0; i < 60; ++i) out << "Line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  return path;
}

const std::string kTiny =
    " --layers 1 --heads 2 --d-model 16 --d-ff 32 --seq-len 16 --batch-size 4 --lr 3e-3 --warmup 2";

std::string saved_precision(const std::string& run, const std::string& step) {
  return nlohmann::json::parse(test::read_file(run + "/" + step + "/state.json")).at("config").at("precision");
}

TEST(CliPrecision, TrainResumeGenerate) {
  const std::string run = test::temp_dir() + "/bf16run";
  const std::string common = "train --data " + data_file() + kTiny +
                             " --steps 6 --eval-interval 3 --log-interval 1 --sample-tokens 10 --out " + run;
  const CmdResult first = cabm(common + " --precision bf16 --stop-at 3");
  ASSERT_EQ(first.status, 0) << first.out << first.err;
  EXPECT_NE(first.out.find("bf16 mixed precision"), std::string::npos) << first.out;
  EXPECT_EQ(saved_precision(run, "step-00000003"), "bf16");

  // --resume keeps bf16 without the flag, and refuses to change it.
  expect_one_line_error(cabm("train --resume --out " + run + " --precision fp32"), "precision");
  const CmdResult resumed = cabm("train --resume --out " + run);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("bf16 mixed precision"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("step 6: validation loss"), std::string::npos) << resumed.out;
  EXPECT_EQ(saved_precision(run, "step-00000006"), "bf16");
  // Checkpoints stay fp32.
  const SafetensorsFile model = read_safetensors(run + "/step-00000006/model.safetensors");
  EXPECT_EQ(model.get("embed.weight").dtype(), DType::F32);

  const CmdResult gen = cabm("generate --checkpoint " + run + " --prompt 'The ' --tokens 30 --precision bf16 --seed 2");
  ASSERT_EQ(gen.status, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("The ", 0), 0u) << gen.out;
  EXPECT_EQ(cabm("generate --checkpoint " + run + " --prompt 'The ' --tokens 30 --precision bf16 --seed 2").out,
            gen.out);  // deterministic
  EXPECT_EQ(cabm("generate --checkpoint " + run + " --prompt 'The ' --tokens 30 --seed 2").status, 0);

  expect_one_line_error(cabm("train --precision foo --out " + run + "-x"), "unknown precision 'foo'");
  expect_one_line_error(cabm("generate --checkpoint " + run + " --precision fp16"), "unknown precision 'fp16'");
}

using test::rel_diff;

TEST(CliPrecision, ForwardBf16AgainstFp32) {
  const std::string dir = test::temp_dir();
  // A 2-layer post-norm TransformerEncoder (E 16, H 2, F 32) with random weights.
  EncoderLayerConfig config{16, 2, 32, 0.0f};
  Encoder encoder = make_encoder(config, 2, false);
  Rng rng(4);
  init_parameters(encoder, rng);
  write_safetensors(dir + "/model.safetensors", to_tensor_map(named_parameters(encoder, "")),
                    {{"module", "TransformerEncoder"}, {"nhead", "2"}});
  const Tensor src = test::random_tensor({2, 9, 16}, 5);
  write_safetensors(dir + "/in.safetensors", {{"src", src}}, {{"is_causal", "true"}});
  const std::string args = "forward --model " + dir + "/model.safetensors --input " + dir + "/in.safetensors";
  ASSERT_EQ(cabm(args + " --output " + dir + "/fp32.safetensors").status, 0);
  ASSERT_EQ(cabm(args + " --output " + dir + "/fp32b.safetensors --precision fp32").status, 0);
  const CmdResult bf = cabm(args + " --output " + dir + "/bf16.safetensors --precision bf16");
  ASSERT_EQ(bf.status, 0) << bf.err;
  const Tensor a = read_safetensors(dir + "/fp32.safetensors").get("output");
  const Tensor b = read_safetensors(dir + "/fp32b.safetensors").get("output");
  const Tensor c = read_safetensors(dir + "/bf16.safetensors").get("output");
  EXPECT_EQ(a.to_vector(), b.to_vector());  // --precision fp32 is the default, bit for bit
  // Two layers of 6 bf16 product stages each, 3u per stage (tests/nn/test_mixed_precision.cpp);
  // LayerNorm outputs have unit scale, so the cancellation factor is O(1): allowed 2× here.
  const double u = 1.0 / 256, d = rel_diff(c, a);
  EXPECT_GT(d, 0.0);
  EXPECT_LE(d, 2 * 6 * 3 * u * 2) << d;

  // MultiheadAttention with need_weights (the reference on bf16-rounded Q, K, V).
  MultiHeadAttention mha = make_multi_head_attention({16, 2});
  init_parameters(mha, rng);
  write_safetensors(dir + "/mha.safetensors", to_tensor_map(named_parameters(mha, "")),
                    {{"module", "MultiheadAttention"}, {"nhead", "2"}});
  write_safetensors(dir + "/q.safetensors", {{"query", src}, {"key", src}, {"value", src}});
  const std::string margs = "forward --model " + dir + "/mha.safetensors --input " + dir + "/q.safetensors";
  ASSERT_EQ(cabm(margs + " --output " + dir + "/m32.safetensors").status, 0);
  ASSERT_EQ(cabm(margs + " --output " + dir + "/m16.safetensors --precision bf16").status, 0);
  const SafetensorsFile m32 = read_safetensors(dir + "/m32.safetensors"),
                        m16 = read_safetensors(dir + "/m16.safetensors");
  EXPECT_LE(rel_diff(m16.get("output"), m32.get("output")), 4 * 3 * u * 2);
  EXPECT_LE(rel_diff(m16.get("attn_weights"), m32.get("attn_weights")), 3 * 3 * u * 2);

  expect_one_line_error(cabm(args + " --output " + dir + "/x.safetensors --precision foo"), "unknown precision 'foo'");
}

TEST(CliPrecision, BenchModelCommandsExist) {
  for (const char* sub : {"bench layer", "bench train"}) {
    const CmdResult r = cabm(std::string(sub) + " --help");
    EXPECT_EQ(r.status, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
  }
  const CmdResult r = cabm("bench layer --batch 1 --seq-len 16 --d-model 32 --heads 2 --d-ff 64 --repeats 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("forward+backward"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cabm
