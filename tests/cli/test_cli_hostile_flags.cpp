// Issue 16, hostile command lines: every numeric flag of every subcommand is checked for type
// and range (and NaN) before anything runs, with its name in the one-line message, and exit
// status 2 for every usage error (CLI11's own parse errors exited with 104–114); failures
// while running exit with 1. `cabm forward` refuses input tensors and metadata its module does
// not take. Commands run under an address-space and CPU limit, so that a flag that slips
// through fails the test quickly instead of training for hours or filling the machine.
#include "cabm/interop/state_dict.h"
#include "cabm/io/safetensors.h"
#include "cabm/nn/encoder_layer.h"
#include "cabm/nn/multi_head_attention.h"
#include "cabm/nn/parameters.h"
#include "util/test_util.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace cabm {
namespace {

namespace fs = std::filesystem;
using test::CmdResult;

std::string path(const std::string& name) {
  return test::temp_dir() + "/" + name;
}

// Every case here is refused before any work: 20 s of CPU is far more than one needs, and ends a
// regression (a benchmark of 2^62 sequences, 2^64 training steps) quickly.
CmdResult cabm(const std::vector<std::string>& args) {
  test::RunLimits limits;
  limits.cpu_seconds = 20;
  return test::run_cabm_limited(args, limits);
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Exit status 2, one line on stderr naming `flag`.
void expect_usage_error(const CmdResult& r, const std::string& flag, const std::string& context) {
  EXPECT_EQ(r.signal, 0) << context << ": killed by signal " << r.signal;
  EXPECT_EQ(r.status, 2) << context << "\n" << r.out << r.err;
  EXPECT_FALSE(r.err.empty()) << context;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << context << ": more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(flag), std::string::npos) << context << "\n" << r.err;
}

// Arguments that make each subcommand fail fast (exit 1) should a bad value slip through the
// checks: a missing data file or checkpoint.
const std::vector<std::pair<std::string, std::string>> kSubcommands = {
    {"train", "--data /nonexistent/corpus.txt --out /nonexistent/run"},
    {"generate", "--checkpoint /nonexistent/run"},
    {"eval", "--checkpoint /nonexistent/run"},
    {"forward", "--model /nonexistent/m --input /nonexistent/i --output /nonexistent/o"},
    {"bench attention", ""},
    {"bench decode", "--m 1 --d 1 --repeats 1"},
    {"attention", "--input /nonexistent/i --output /nonexistent/o"},
    {"bench layer", ""},
    {"bench train", ""},
    {"memory", ""},
};

struct NumericOption {
  std::string name, type;  // "--steps", "INT" | "UINT" | "FLOAT"
};

// The numeric options of a subcommand, from its --help (CLI11 prints "--steps INT:in [...]").
std::vector<NumericOption> numeric_options(const std::string& subcommand) {
  std::vector<std::string> args = words(subcommand);
  args.push_back("--help");
  const CmdResult help = cabm(args);
  EXPECT_EQ(help.status, 0) << subcommand;
  std::vector<NumericOption> out;
  const std::regex line(R"(^\s+(--[a-z][a-z0-9-]*)\s+(INT|UINT|FLOAT)\b)");
  std::istringstream in(help.out);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) out.push_back({m[1], m[2]});
  }
  return out;
}

// Every numeric option of every subcommand refuses values that are not numbers of its kind or
// that lie outside any sane range: the sweep covers options added later, too.
TEST(HostileFlags, EveryNumericOptionIsChecked) {
  int checked = 0;
  for (const auto& [subcommand, fail_fast] : kSubcommands) {
    const std::vector<NumericOption> options = numeric_options(subcommand);
    EXPECT_FALSE(options.empty()) << subcommand;
    for (const NumericOption& o : options) {
      std::vector<std::string> bad;
      if (o.type == "INT") bad = {"1.5", "99999999999999999999", "0x10", "nan", "-99999999999999999999"};
      if (o.type == "UINT") bad = {"-1", "18446744073709551616", "1.5"};
      if (o.type == "FLOAT") bad = {"nan", "inf", "-inf", "1e999", "abc"};
      for (const std::string& value : bad) {
        std::vector<std::string> args = words(subcommand);
        for (const std::string& w : words(fail_fast)) args.push_back(w);
        args.push_back(o.name);
        args.push_back(value);
        expect_usage_error(cabm(args), o.name, subcommand + " " + o.name + " " + value);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 150);
}

// F2 (signed overflow, then a segfault) and F3 (gigabytes allocated before any check).
TEST(HostileFlags, F2_F3_HugeSizes) {
  const std::string out = "--out=" + path("run");
  for (const auto& [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"train --batch-size 4611686018427387904", "--batch-size"},
           {"memory --batch-size 4611686018427387904 --seq-len 4", "--batch-size"},
           {"train --layers 1099511627776", "--layers"},
           {"train --accum 1099511627776", "--accum"},
           {"memory --layers 1099511627776", "--layers"},
           {"bench attention --batch 4611686018427387904", "--batch"},
           {"bench attention --n 64,4611686018427387904", "--n"},
           {"bench layer --seq-len 4611686018427387904", "--seq-len"},
           {"bench train --batch-size 4611686018427387904", "--batch-size"},
           {"train --batch-size 65536 --seq-len 65536", "--batch-size"},  // each in range, B·T not
           {"generate --checkpoint x --tokens 9223372036854775807", "--tokens"},
           {"eval --checkpoint x --batch-size 4611686018427387904", "--batch-size"}}) {
    std::vector<std::string> a = words(args);
    if (a[0] == "train") a.insert(a.end(), {out, "--data=/nonexistent/corpus.txt"});  // fails fast if let through
    expect_usage_error(cabm(a), flag, args);
  }
}

// F6: accepted with exit 0 before: a negative learning rate, clipping turned off by NaN, a step
// count clamped to INT64_MAX, a seed wrapped to 2^64 − 1, a benchmark of 2^62 sequences.
TEST(HostileFlags, F6_NonsenseValues) {
  const std::string out = "--out=" + path("run");
  for (const auto& [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"train --min-lr-ratio -5", "--min-lr-ratio"},
           {"train --min-lr-ratio 1.5", "--min-lr-ratio"},
           {"train --clip nan", "--clip"},
           {"train --clip -1", "--clip"},
           {"train --lr 0", "--lr"},
           {"train --lr -0.001", "--lr"},
           {"train --lr inf", "--lr"},
           {"train --dropout 1", "--dropout"},
           {"train --weight-decay -0.1", "--weight-decay"},
           {"train --steps 18446744073709551616", "--steps"},
           {"train --steps 0", "--steps"},
           {"train --seed -1", "--seed"},
           {"train --warmup -1", "--warmup"},
           {"train --keep 0", "--keep"},
           {"train --task translate", "--task"},
           {"train --precision fp8", "--precision"},
           {"train --d-model 30 --heads 4", "--d-model"},
           {"generate --checkpoint x --seed -1", "--seed"},
           {"generate --checkpoint x --temperature nan", "--temperature"},
           {"generate --checkpoint x --temperature -1", "--temperature"},
           {"generate --checkpoint x --top-k -1", "--top-k"},
           {"generate --checkpoint x --precision fp16", "--precision"},
           {"eval --checkpoint x --max-windows -1", "--max-windows"},
           {"bench attention --masks none,diagonal", "diagonal"},
           {"bench attention --precision fp64", "--precision"},
           {"bench layer --mask diagonal", "--mask"},
           {"forward --model m --input i --output o --threads 0", "--threads"},
           {"memory --vocab 0", "--vocab"}}) {
    std::vector<std::string> a = words(args);
    if (a[0] == "train") a.insert(a.end(), {out, "--data=/nonexistent/corpus.txt"});  // fails fast if let through
    expect_usage_error(cabm(a), flag, args);
  }
}

// Exit status 2 for what is wrong with the command line, 1 for what fails while running it, 0
// for --help and --version; the top-level help says so.
TEST(HostileFlags, ExitCodes) {
  expect_usage_error(cabm({"train", "--no-such-flag"}), "--no-such-flag", "unknown flag");
  expect_usage_error(cabm({"generate"}), "--checkpoint", "missing required flag");
  expect_usage_error(cabm({"memory", "--layers"}), "--layers", "flag without its value");
  expect_usage_error(cabm({"train", "--steps", "many"}), "--steps", "malformed value");
  expect_usage_error(cabm({"translate"}), "subcommand", "unknown subcommand");
  expect_usage_error(cabm({}), "subcommand", "no subcommand");
  expect_usage_error(cabm({"bench"}), "subcommand", "bench without its subcommand");
  {
    const CmdResult r = cabm({"eval", "--checkpoint", "/nonexistent/run"});
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find("/nonexistent/run"), std::string::npos) << r.err;
  }
  {
    const CmdResult r = cabm({"train", "--data", "/nonexistent/corpus.txt", "--out", path("x")});
    EXPECT_EQ(r.status, 1) << r.err;
  }
  EXPECT_EQ(cabm({"--version"}).status, 0);
  const CmdResult help = cabm({"--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("Exit status: 0 success; 1 failure"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("2 usage error"), std::string::npos) << help.out;
  for (const auto& [subcommand, unused] : kSubcommands) {
    std::vector<std::string> args = words(subcommand);
    args.push_back("--help");
    EXPECT_EQ(cabm(args).status, 0) << subcommand;
  }
}

// F6: `cabm forward` ignored input tensors its module does not take, so an encoder given
// MultiheadAttention's attn_mask or key_padding_mask ran unmasked and exited 0.
struct ForwardFiles {
  std::map<std::string, Tensor> model;
  std::map<std::string, std::string> model_meta;
  std::map<std::string, Tensor> input;
  std::map<std::string, std::string> input_meta;

  CmdResult run() {
    write_safetensors(path("model.safetensors"), model, model_meta);
    write_safetensors(path("input.safetensors"), input, input_meta);
    return cabm({"forward", "--model", path("model.safetensors"), "--input", path("input.safetensors"), "--output",
                 path("out.safetensors")});
  }
};

ForwardFiles encoder_layer_files() {
  ForwardFiles f;
  EncoderLayer layer = make_encoder_layer({8, 2, 16, 0.0f});
  uint64_t seed = 10;
  for (const NamedTensor& p : named_parameters(layer)) {
    Tensor t = p.tensor;
    t.copy_from(test::random_tensor(t.shape(), seed++));
  }
  f.model = to_tensor_map(named_parameters(layer));
  f.model_meta = {{"module", "TransformerEncoderLayer"}, {"nhead", "2"}};
  f.input = {{"src", test::random_tensor({2, 5, 8}, 3)}};
  return f;
}

ForwardFiles attention_files() {
  ForwardFiles f;
  MultiHeadAttentionConfig config;
  config.embed_dim = 8;
  config.num_heads = 2;
  MultiHeadAttention mha = make_multi_head_attention(config);
  uint64_t seed = 20;
  for (const NamedTensor& p : named_parameters(mha)) {
    Tensor t = p.tensor;
    t.copy_from(test::random_tensor(t.shape(), seed++));
  }
  f.model = to_tensor_map(named_parameters(mha));
  f.model_meta = {{"module", "MultiheadAttention"}, {"nhead", "2"}};
  f.input = {{"query", test::random_tensor({2, 5, 8}, 3)},
             {"key", test::random_tensor({2, 4, 8}, 4)},
             {"value", test::random_tensor({2, 4, 8}, 5)}};
  return f;
}

void expect_forward_error(const CmdResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  for (const std::string& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << n << "\n" << r.err;
}

TEST(HostileFlags, F6_ForwardRefusesInputsItsModuleDoesNotTake) {
  {
    ForwardFiles f = encoder_layer_files();
    const CmdResult ok = f.run();
    ASSERT_EQ(ok.status, 0) << ok.err;
  }
  for (const char* name : {"attn_mask", "key_padding_mask", "query", "srcs"}) {
    ForwardFiles f = encoder_layer_files();
    f.input[name] = Tensor::zeros({5, 5}, DType::BOOL);
    expect_forward_error(f.run(),
                         {"input.safetensors", std::string("'") + name + "'", "src, mask, src_key_padding_mask"});
  }
  for (const char* name : {"mask", "src_key_padding_mask", "src"}) {
    ForwardFiles f = attention_files();
    f.input[name] = Tensor::zeros({5, 4}, DType::BOOL);
    expect_forward_error(f.run(), {std::string("'") + name + "'", "query, key, value, attn_mask, key_padding_mask"});
  }
  {  // metadata: a misspelled is_causal ran non-causal; another module's keys
    ForwardFiles f = encoder_layer_files();
    f.input_meta["is_casual"] = "true";
    expect_forward_error(f.run(), {"'is_casual'", "is_causal"});
    ForwardFiles g = encoder_layer_files();
    g.input_meta["need_weights"] = "true";
    expect_forward_error(g.run(), {"'need_weights'"});
    ForwardFiles h = attention_files();
    h.input_meta["is_casual"] = "true";
    expect_forward_error(h.run(), {"'is_casual'", "need_weights, average_attn_weights, is_causal"});
  }
  {  // the safetensors "format" convention is not an error
    ForwardFiles f = attention_files();
    f.input_meta["format"] = "pt";
    f.input_meta["need_weights"] = "false";
    const CmdResult r = f.run();
    EXPECT_EQ(r.status, 0) << r.err;
  }
}

}  // namespace
}  // namespace cabm
