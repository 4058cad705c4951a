// `cabm embed` and `cabm classify` end to end (the contract in docs/hf_models.md), against
// sentence-transformers and transformers on the hard-strings corpus (tests/fixtures/hf_make_models.py):
// the real all-MiniLM-L6-v2 through its own tokenizer, a random BertForSequenceClassification with
// MiniLM's tokenizer, results independent of --batch-size, and the one-line refusals.
#include "cabm/io/safetensors.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace cabm {
namespace {

namespace fs = std::filesystem;

std::string hf_dir() {
  return std::string(CABM_HF_FIXTURES_DIR) + "/models";
}
std::string minilm() {
  return test::read_file(hf_dir() + "/minilm_dir.txt");
}
std::string corpus() {
  return hf_dir() + "/hard_strings.txt";
}
std::string out_path(const std::string& name) {
  return test::temp_dir() + "/" + name;
}

test::CmdResult cabm(const std::string& args) {
  return test::run_cabm(args);
}

// Embeddings within fp32 tolerance of sentence-transformers: unit vectors of 384 dims, each
// component the result of 6 layers of products of length <= 1536 (cf. tests/interop/test_hf_models.cpp).
constexpr double kEmbedTol = 2e-6;

TEST(HfEmbed, MiniLMEqualsSentenceTransformers) {
  const std::string out = out_path("minilm.safetensors");
  const test::CmdResult r = cabm("embed --model " + minilm() + " --input " + corpus() + " --output " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const SafetensorsFile got = read_safetensors(out);
  const SafetensorsFile want = read_safetensors(hf_dir() + "/minilm.expected.safetensors");
  ASSERT_EQ(got.tensors.size(), 1u);
  EXPECT_EQ(got.get("embeddings").shape(), want.get("embeddings").shape());
  EXPECT_CLOSE(got.get("embeddings"), want.get("embeddings"), kEmbedTol, kEmbedTol);
  EXPECT_EQ(got.get_metadata("pooling"), "mean");
  EXPECT_EQ(got.get_metadata("normalize"), "true");

  // Every batch size and the standard input give the same numbers (length-sorted batches).
  for (const char* batch : {"1", "3", "100"}) {
    const std::string o = out_path(std::string("minilm-b") + batch + ".safetensors");
    const test::CmdResult rb =
        cabm("embed --model " + minilm() + " --input " + corpus() + " --output " + o + " --batch-size " + batch);
    ASSERT_EQ(rb.status, 0) << rb.err;
    EXPECT_CLOSE(read_safetensors(o).get("embeddings"), got.get("embeddings"), 1e-6, 1e-6);
  }
  const std::string o = out_path("minilm-stdin.safetensors");
  const std::string cmd = "cat " + corpus() + " | CABM_NUM_THREADS=2 " + test::cabm_binary() + " embed --model " +
                          minilm() + " --input - --output " + o + " --threads 1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_CLOSE(read_safetensors(o).get("embeddings"), got.get("embeddings"), 1e-6, 1e-6);
}

TEST(HfEmbed, PoolingOptions) {
  const SafetensorsFile want = read_safetensors(hf_dir() + "/minilm.expected.safetensors");
  const Tensor& st = want.get("embeddings");
  const int64_t n = st.size(0), E = st.size(1);
  // --pooling none: the hidden states and sentence-transformers' own attention mask.
  const std::string none = out_path("none.safetensors");
  test::CmdResult r = cabm("embed --model " + minilm() + " --input " + corpus() + " --output " + none +
                           " --pooling none --batch-size 5");
  ASSERT_EQ(r.status, 0) << r.err;
  const SafetensorsFile h = read_safetensors(none);
  const Tensor& mask = h.get("attention_mask");
  ASSERT_EQ(mask.dtype(), DType::I64);
  ASSERT_EQ(mask.shape(), want.get("attention_mask").shape());
  EXPECT_TRUE(std::equal(mask.data<int64_t>(), mask.data<int64_t>() + mask.numel(),
                         want.get("attention_mask").data<int64_t>()));
  const Tensor& hidden = h.get("last_hidden_state");
  ASSERT_EQ(hidden.shape(), (Shape{n, mask.size(1), E}));
  // --pooling mean without --normalize: the same direction as sentence-transformers, not unit length.
  const std::string mean = out_path("mean.safetensors");
  r = cabm("embed --model " + minilm() + " --input " + corpus() + " --output " + mean + " --pooling mean");
  ASSERT_EQ(r.status, 0) << r.err;
  const Tensor m = read_safetensors(mean).get("embeddings");
  const int64_t T = mask.size(1);
  for (int64_t i = 0; i < n; ++i) {
    double norm = 0;
    int64_t len = 0;
    for (int64_t t = 0; t < T; ++t) len += mask.data<int64_t>()[i * T + t];
    std::vector<float> pooled(static_cast<size_t>(E));
    for (int64_t j = 0; j < E; ++j) {
      double s = 0;
      for (int64_t t = 0; t < len; ++t) s += hidden.at({i, t, j});
      pooled[static_cast<size_t>(j)] = static_cast<float>(s / static_cast<double>(len));
      norm += double{m.at({i, j})} * m.at({i, j});
    }
    EXPECT_GT(std::fabs(std::sqrt(norm) - 1.0), 1e-3);
    EXPECT_CLOSE(Tensor::from_vector(pooled, {E}), m.select(0, i), 1e-5, 1e-6);
    std::vector<float> unit(static_cast<size_t>(E));
    for (int64_t j = 0; j < E; ++j) unit[static_cast<size_t>(j)] = static_cast<float>(m.at({i, j}) / std::sqrt(norm));
    EXPECT_CLOSE(Tensor::from_vector(unit, {E}), st.select(0, i), kEmbedTol, kEmbedTol);
  }
  // --pooling cls --normalize: the first token's state, unit length.
  const std::string cls = out_path("cls.safetensors");
  r = cabm("embed --model " + minilm() + " --input " + corpus() + " --output " + cls + " --pooling cls --normalize");
  ASSERT_EQ(r.status, 0) << r.err;
  const Tensor c = read_safetensors(cls).get("embeddings");
  for (int64_t i = 0; i < n; ++i) {
    double norm = 0;
    for (int64_t j = 0; j < E; ++j) norm += double{hidden.at({i, 0, j})} * hidden.at({i, 0, j});
    for (int64_t j = 0; j < E; j += 37) EXPECT_NEAR(c.at({i, j}), hidden.at({i, 0, j}) / std::sqrt(norm), 1e-6);
  }
  // --max-length truncates (special tokens included).
  const std::string short_out = out_path("short.safetensors");
  r = cabm("embed --model " + minilm() + " --input " + corpus() + " --output " + short_out +
           " --pooling none --max-length 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_safetensors(short_out).get("last_hidden_state").size(1), 8);
}

// A view of the MiniLM directory (links to its files) with other sentence-transformers modules.
fs::path minilm_variant(const std::string& name, const nlohmann::json& modules, const nlohmann::json* pooling) {
  const fs::path dir = fs::path(test::temp_dir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const fs::directory_entry& e : fs::directory_iterator(minilm()))
    if (e.is_regular_file() && e.path().filename() != "modules.json")
      fs::create_symlink(e.path(), dir / e.path().filename());
  std::ofstream(dir / "modules.json") << modules.dump(2);
  if (pooling) {
    fs::create_directories(dir / "1_Pooling");
    std::ofstream(dir / "1_Pooling" / "config.json") << pooling->dump(2);
  }
  return dir;
}

TEST(HfEmbed, SentenceTransformersModules) {
  using J = nlohmann::json;
  const J transformer = {{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}};
  const J pooling = {
      {"idx", 1}, {"name", "1"}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}};
  const J dense = {{"idx", 2}, {"name", "2"}, {"path", "2_Dense"}, {"type", "sentence_transformers.models.Dense"}};
  const J cls_config = {{"pooling_mode_cls_token", true}, {"pooling_mode_mean_tokens", false}};
  const fs::path cls = minilm_variant("st_cls", J::array({transformer, pooling}), &cls_config);
  const std::string in = " --input " + corpus();
  const std::string a = out_path("st_cls.safetensors"), b = out_path("st_cls_flag.safetensors");
  test::CmdResult r = cabm("embed --model " + cls.string() + in + " --output " + a);
  ASSERT_EQ(r.status, 0) << r.err;
  r = cabm("embed --model " + minilm() + in + " --output " + b + " --pooling cls");
  ASSERT_EQ(r.status, 0) << r.err;
  const SafetensorsFile got = read_safetensors(a);
  EXPECT_EQ(got.get_metadata("pooling"), "cls");
  EXPECT_EQ(got.get_metadata("normalize"), "false");  // no Normalize module
  EXPECT_CLOSE(got.get("embeddings"), read_safetensors(b).get("embeddings"), 0, 0);
  // Modules cabm does not run are refused, unless --pooling says what to do instead.
  const J mean_config = {{"pooling_mode_cls_token", false}, {"pooling_mode_mean_tokens", true}};
  const fs::path with_dense = minilm_variant("st_dense", J::array({transformer, pooling, dense}), &mean_config);
  r = cabm("embed --model " + with_dense.string() + in + " --output " + a);
  EXPECT_EQ(r.status, 1);
  test::expect_one_line_error(r, "sentence_transformers.models.Dense");
  r = cabm("embed --model " + with_dense.string() + in + " --output " + a + " --pooling mean");
  EXPECT_EQ(r.status, 0) << r.err;
  const J max_config = {{"pooling_mode_max_tokens", true}, {"pooling_mode_mean_tokens", false}};
  const fs::path max = minilm_variant("st_max", J::array({transformer, pooling}), &max_config);
  r = cabm("embed --model " + max.string() + in + " --output " + a);
  EXPECT_EQ(r.status, 1);
  test::expect_one_line_error(r, "'pooling_mode_max_tokens'");
}

TEST(HfEmbed, Bf16) {
  const std::string out = out_path("bf16.safetensors");
  const test::CmdResult r =
      cabm("embed --model " + minilm() + " --input " + corpus() + " --output " + out + " --precision bf16");
  ASSERT_EQ(r.status, 0) << r.err;
  const SafetensorsFile expected = read_safetensors(hf_dir() + "/minilm.expected.safetensors");
  const Tensor& want = expected.get("embeddings");
  const Tensor got = read_safetensors(out).get("embeddings");
  const double rel = test::rel_diff(got, want);
  EXPECT_LT(rel, std::ldexp(1.0, -8) * std::sqrt(7.0));  // u = 2^-8 per bf16 operand, growing as √(L+1), L = 6
  EXPECT_GT(rel, 1e-5);                                  // and bf16 really ran
}

// The probabilities transformers' logits give one row: softmax, or sigmoids (multi-label).
std::vector<double> probabilities(const Tensor& logits, int64_t i, bool multi_label) {
  std::vector<double> p(static_cast<size_t>(logits.size(1)));
  double mx = -1e300, sum = 0;
  for (int64_t j = 0; j < logits.size(1); ++j) mx = std::max(mx, double{logits.at({i, j})});
  for (int64_t j = 0; j < logits.size(1); ++j) {
    const double x = logits.at({i, j});
    sum += p[static_cast<size_t>(j)] = multi_label ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x - mx);
  }
  if (!multi_label)
    for (double& v : p) v /= sum;
  return p;
}

// `cabm classify --top-k 2` on the corpus: logits equal to transformers', and per input a line
// "N<TAB>label<TAB>prob<TAB>label<TAB>prob" with the two most probable labels.
void check_classify(const std::string& name, const std::vector<std::string>& labels, bool multi_label) {
  SCOPED_TRACE(name);
  const std::string model = hf_dir() + "/" + name;
  const std::string out = out_path(name + "-logits.safetensors");
  const test::CmdResult r =
      cabm("classify --model " + model + " --input " + corpus() + " --output " + out + " --top-k 2 --batch-size 4");
  ASSERT_EQ(r.status, 0) << r.err;
  const SafetensorsFile expected = read_safetensors(hf_dir() + "/" + name + ".expected.safetensors");
  const Tensor& want = expected.get("logits");
  const Tensor got = read_safetensors(out).get("logits");
  EXPECT_CLOSE(got, want, 1e-5, 1e-6);
  std::istringstream lines(r.out);
  std::string line;
  int64_t i = 0;
  for (; std::getline(lines, line); ++i) {
    ASSERT_LT(i, want.size(0)) << r.out;
    std::vector<double> p = probabilities(want, i, multi_label);
    std::vector<int64_t> order(p.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int64_t>(j);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    std::istringstream fields(line);
    std::string number, label1, prob1, label2, prob2, rest;
    ASSERT_TRUE(std::getline(fields, number, '\t') && std::getline(fields, label1, '\t') &&
                std::getline(fields, prob1, '\t') && std::getline(fields, label2, '\t') &&
                std::getline(fields, prob2, '\t'))
        << line;
    EXPECT_FALSE(std::getline(fields, rest, '\t')) << line;
    EXPECT_EQ(number, std::to_string(i + 1));
    EXPECT_EQ(label1, labels[static_cast<size_t>(order[0])]) << line;
    EXPECT_EQ(label2, labels[static_cast<size_t>(order[1])]) << line;
    EXPECT_NEAR(std::stod(prob1), p[static_cast<size_t>(order[0])], 6e-5) << line;
    EXPECT_NEAR(std::stod(prob2), p[static_cast<size_t>(order[1])], 6e-5) << line;
  }
  EXPECT_EQ(i, want.size(0));
}

TEST(HfClassify, LabelsAndLogitsEqualTransformers) {
  // BERT with MiniLM's WordPiece tokenizer (softmax); RoBERTa with a byte-level BPE tokenizer
  // (multi-label: sigmoids), whose positions start after the pad id.
  check_classify("bert_cls_tok", {"alpha", "beta", "gamma", "delta", "epsilon"}, false);
  check_classify("roberta_cls_tok", {"red", "green", "blue"}, true);
  const std::string model = hf_dir() + "/bert_cls_tok";
  // Without --output: only the lines; --top-k beyond the labels prints them all.
  const test::CmdResult all = cabm("classify --model " + model + " --input " + corpus() + " --top-k 9");
  ASSERT_EQ(all.status, 0) << all.err;
  const std::string first = all.out.substr(0, all.out.find('\n'));
  EXPECT_EQ(std::count(first.begin(), first.end(), '\t'), 10) << first;
}

// ---- refusals: one line on stderr naming the problem, status 1 (failure) or 2 (usage) -------------

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

fs::path copy_classifier(const std::string& to) {
  const fs::path dst = fs::path(test::temp_dir()) / to;
  fs::remove_all(dst);
  fs::copy(fs::path(hf_dir()) / "bert_cls_tok", dst, fs::copy_options::recursive);
  return dst;
}

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json c = read_json(dir / "config.json");
  edit(c);
  std::ofstream(dir / "config.json") << c.dump(2);
}

void expect_refused(const std::string& args, int status, const std::string& needle) {
  SCOPED_TRACE(args);
  const test::CmdResult r = cabm(args);
  EXPECT_EQ(r.status, status) << r.err;
  test::expect_one_line_error(r, needle);
}

TEST(HfCommands, ModelRefusals) {
  const std::string in = " --input " + corpus();
  const std::string out = " --output " + out_path("never.safetensors");
  const fs::path pickle = copy_classifier("pickle");
  fs::remove(pickle / "model.safetensors");
  std::ofstream(pickle / "pytorch_model.bin") << "PK";
  for (const char* cmd : {"classify", "embed"}) {
    const std::string c = std::string(cmd) + " --model ";
    expect_refused(c + pickle.string() + in + out, 1, "execute code");
  }
  const fs::path arch = copy_classifier("arch");
  edit_config(arch, [](nlohmann::json& c) { c["architectures"] = {"BertForTokenClassification"}; });
  expect_refused("classify --model " + arch.string() + in, 1, "'architectures'");
  const fs::path act = copy_classifier("act");
  edit_config(act, [](nlohmann::json& c) { c["hidden_act"] = "mish"; });
  expect_refused("embed --model " + act.string() + in + out, 1, "'hidden_act'");
  const fs::path missing = copy_classifier("missing");
  {
    SafetensorsFile f = read_safetensors((missing / "model.safetensors").string());
    f.tensors.erase("classifier.weight");
    f.tensors["bert.pooler.dense.weight"] = Tensor::zeros({32, 31});
    write_safetensors((missing / "model.safetensors").string(), f.tensors);
  }
  expect_refused("classify --model " + missing.string() + in, 1, "'bert.pooler.dense.weight' has shape [32, 31]");
  {
    SafetensorsFile f = read_safetensors((missing / "model.safetensors").string());
    f.tensors["bert.pooler.dense.weight"] = Tensor::zeros({32, 32});
    write_safetensors((missing / "model.safetensors").string(), f.tensors);
  }
  expect_refused("classify --model " + missing.string() + in, 1, "missing tensor 'classifier.weight'");
  // A NaN or ±inf weight made every output NaN with exit 0.
  const fs::path nonfinite = copy_classifier("nonfinite");
  {
    SafetensorsFile f = read_safetensors((nonfinite / "model.safetensors").string());
    f.tensors.at("classifier.weight").data<float>()[2] = std::nanf("");
    f.tensors.at("bert.encoder.layer.0.attention.self.query.weight").data<float>()[9] =
        -std::numeric_limits<float>::infinity();
    write_safetensors((nonfinite / "model.safetensors").string(), f.tensors);
  }
  expect_refused(
      "classify --model " + nonfinite.string() + in, 1,
      "model.safetensors: tensor 'bert.encoder.layer.0.attention.self.query.weight' holds -inf at element 9");
  expect_refused("embed --model " + nonfinite.string() + in + out, 1, "must be finite");
  // A bare encoder has no labels.
  expect_refused("classify --model " + minilm() + in, 1, "no classification head");
  expect_refused("embed --model " + test::temp_dir() + "/nothing" + in + out, 1, "nothing");
  EXPECT_FALSE(fs::exists(out_path("never.safetensors")));
}

TEST(HfCommands, InputAndFlagRefusals) {
  const std::string model = " --model " + minilm();
  const std::string out = " --output " + out_path("never2.safetensors");
  const std::string bad = out_path("bad.txt");
  std::ofstream(bad) << "fine\nalso fine\nbroken \xC3\x28 here\n";
  expect_refused("embed" + model + " --input " + bad + out, 1, "line 3");
  expect_refused("embed" + model + " --input " + out_path("absent.txt") + out, 1, "absent.txt");
  const std::string in = " --input " + corpus();
  expect_refused("embed" + model + in + out + " --pooling max", 2, "--pooling");
  expect_refused("embed" + model + in + out + " --batch-size 0", 2, "--batch-size");
  expect_refused("embed" + model + in + out + " --max-length 1.5", 2, "--max-length");
  expect_refused("embed" + model + in + out + " --max-length 513", 2, "--max-length 513");
  expect_refused("embed" + model + in + out + " --pooling none --normalize", 2, "--normalize");
  expect_refused("embed" + model + in + out + " --precision fp16", 2, "--precision");
  expect_refused("embed" + model + in, 2, "--output");
  expect_refused("classify --model " + hf_dir() + "/bert_cls_tok" + in + " --top-k 0", 2, "--top-k");
  const fs::path unwritable = fs::path(test::temp_dir()) / "no-dir" / "out.safetensors";
  expect_refused("embed" + model + in + " --output " + unwritable.string(), 1, "no-dir");
  EXPECT_FALSE(fs::exists(out_path("never2.safetensors")));
}

TEST(HfCommands, ProgressOnATerminal) {
  // More inputs than one batch, on a pseudo-terminal from `script`: a progress line on stderr,
  // cleared at the end; nothing of it when stderr is not a terminal (the tests above check "").
  const std::string dir = test::temp_dir();
  const std::string command = "CABM_NUM_THREADS=2 " + test::cabm_binary() + " embed --model " + minilm() + " --input " +
                              corpus() + " --output " + dir + "/tty.safetensors --batch-size 2";
  const std::string shell = "script -qefc '" + command + "' /dev/null >" + dir + "/tty.txt 2>&1 </dev/null";
  ASSERT_EQ(std::system(shell.c_str()), 0) << test::read_file(dir + "/tty.txt");
  const std::string tty = test::read_file(dir + "/tty.txt");
  EXPECT_NE(tty.find("embed: 16/16 texts"), std::string::npos) << tty;
  EXPECT_NE(tty.rfind("\r\x1b[K"), std::string::npos) << tty;
}

// Sentence pairs (--pair-input): the tokenizer's pair template and longest_first truncation, BERT's
// token types 0 then 1 through the token-type embeddings, against transformers' forward on
// tok(firsts, seconds, padding=True, truncation=True).
std::string pair_flags() {
  return " --input " + hf_dir() + "/hard_pairs_first.txt --pair-input " + hf_dir() + "/hard_pairs_second.txt";
}

TEST(HfPairs, ClassifyAndEmbedEqualTransformers) {
  for (const std::string name : {"bert_cls_tok", "roberta_cls_tok"}) {
    SCOPED_TRACE(name);
    const std::string out = out_path(name + "-pairs.safetensors");
    const test::CmdResult r =
        cabm("classify --model " + hf_dir() + "/" + name + pair_flags() + " --output " + out + " --batch-size 3");
    ASSERT_EQ(r.status, 0) << r.err;
    const SafetensorsFile want = read_safetensors(hf_dir() + "/" + name + ".pairs.expected.safetensors");
    EXPECT_CLOSE(read_safetensors(out).get("logits"), want.get("logits"), 1e-5, 1e-6);
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), want.get("logits").size(0));
  }
  const std::string out = out_path("minilm-pairs.safetensors");
  const test::CmdResult r = cabm("embed --model " + minilm() + pair_flags() + " --output " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  const SafetensorsFile want = read_safetensors(hf_dir() + "/minilm.pairs.expected.safetensors");
  EXPECT_CLOSE(read_safetensors(out).get("embeddings"), want.get("embeddings"), kEmbedTol, kEmbedTol);
}

TEST(HfPairs, Refusals) {
  const std::string model = " --model " + hf_dir() + "/bert_cls_tok";
  const std::string three = out_path("three.txt");
  std::ofstream(three) << "a\nb\nc\n";
  const std::string second = hf_dir() + "/hard_pairs_second.txt";
  for (const char* cmd : {"classify", "embed"}) {
    const std::string c = std::string(cmd) + model + " --output " + out_path("never3.safetensors");
    expect_refused(c + " --input " + three + " --pair-input " + second, 1,
                   "--input " + three + " has 3 lines but --pair-input " + second + " has 10");
    expect_refused(c + " --input - --pair-input -", 2, "cannot both be '-'");
    expect_refused(c + " --input " + three + " --pair-input " + three + " --max-length 2", 2, "--max-length 2");
  }
  EXPECT_FALSE(fs::exists(out_path("never3.safetensors")));
}

}  // namespace
}  // namespace cabm
