// Hugging Face BERT-family models against transformers' own forward (tests/fixtures/hf_make_models.py):
// hidden states, pooler outputs and logits of every architecture in fp32 and bf16, the
// length-sorted batching of cabm/interop/hf_pipeline.h (results independent of batch size and
// input order), the real all-MiniLM-L6-v2 against sentence-transformers' embeddings, and the
// refusals (pickle-only directory, unsupported architecture or option, missing or misshapen
// tensor).
#include "cabm/core/threads.h"
#include "cabm/interop/hf_encoder.h"
#include "cabm/interop/hf_pipeline.h"
#include "cabm/io/hf_tokenizer.h"
#include "cabm/io/safetensors.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

namespace cabm {
namespace {

namespace fs = std::filesystem;
using test::compare;

// The directory tests/fixtures/hf_make_models.py wrote (tests/CMakeLists.txt: hf_make_<name>.py
// writes CABM_HF_FIXTURES_DIR/<name>/).
std::string hf_dir() {
  return std::string(CABM_HF_FIXTURES_DIR) + "/models";
}

// Tolerances from the dtype's unit roundoff and the depth of the computation. Each layer adds a
// few roundings on values of magnitude ~1 (LayerNorm outputs) through dot products of length
// K = max(E, F); forward error is bounded by ~K·u per product in the worst case but behaves like
// √K·u; the two LayerNorms per layer re-normalise, so the error grows with the layer count.
double fp32_tolerance(const HfEncoder& m) {
  const double u = std::numeric_limits<float>::epsilon() / 2;
  const double K = static_cast<double>(std::max(m.config.hidden_size, m.config.intermediate_size));
  return 4.0 * u * std::sqrt(K) * static_cast<double>(m.config.num_layers + 1);
}
// bf16 operands: u = 2^-8 per rounded operand; relative (Frobenius) error of the whole output.
double bf16_rel_tolerance(const HfEncoder& m) {
  return std::ldexp(1.0, -8) * std::sqrt(static_cast<double>(m.config.num_layers + 1));
}

struct Expected {
  SafetensorsFile file;
  HfInputs inputs;
};

Expected load_expected(const std::string& name) {
  Expected e{read_safetensors(hf_dir() + "/" + name + ".expected.safetensors"), {}};
  e.inputs.input_ids = e.file.get("input_ids");
  e.inputs.attention_mask = e.file.get("attention_mask");
  e.inputs.token_type_ids = e.file.get("token_type_ids");
  return e;
}

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, Fp32MatchesTransformers) {
  test::ScopedThreads threads(2);
  const HfEncoder model = load_hf_encoder(hf_dir() + "/" + GetParam());
  const Expected e = load_expected(GetParam());
  EXPECT_EQ(e.file.get_metadata("architecture"), model.config.architecture);
  HfEncoderCache cache;
  const HfOutputs out = hf_encoder_forward(model, e.inputs, cache);
  const double tol = fp32_tolerance(model);
  EXPECT_CLOSE(out.last_hidden_state, e.file.get("last_hidden_state"), tol, tol);
  std::printf("%s: max |diff| %.3g (tolerance %.3g)\n", GetParam().c_str(),
              compare(out.last_hidden_state, e.file.get("last_hidden_state"), 0, 0).max_abs_diff, tol);
  // transformers returns the pooler output of bare models (a classifier uses it internally).
  if (e.file.find("pooler_output")) {
    ASSERT_TRUE(out.pooler_output.defined());
    EXPECT_CLOSE(out.pooler_output, e.file.get("pooler_output"), tol, tol);
  } else if (!model.has_classifier()) {
    EXPECT_FALSE(out.pooler_output.defined());
  }
  EXPECT_EQ(out.logits.defined(), e.file.find("logits") != nullptr);
  if (out.logits.defined()) {
    EXPECT_CLOSE(out.logits, e.file.get("logits"), tol, tol);
  }
  // The tolerance is meaningful: the same model with a LayerNorm eps of 1e-3 misses it.
  HfEncoder wrong = load_hf_encoder(hf_dir() + "/" + GetParam());
  wrong.embed_norm.eps = 1e-3f;
  for (EncoderLayer& layer : wrong.layers) layer.norm1.eps = layer.norm2.eps = 1e-3f;
  HfEncoderCache wrong_cache;
  EXPECT_FALSE(compare(hf_encoder_forward(wrong, e.inputs, wrong_cache).last_hidden_state,
                       e.file.get("last_hidden_state"), tol, tol)
                   .ok);
}

TEST_P(HfParity, Bf16MatchesTransformersLoosely) {
  test::ScopedThreads threads(2);
  HfEncoder model = load_hf_encoder(hf_dir() + "/" + GetParam());
  set_precision(model, Precision::kBf16);
  const Expected e = load_expected(GetParam());
  HfEncoderCache cache;
  const HfOutputs out = hf_encoder_forward(model, e.inputs, cache);
  const double tol = bf16_rel_tolerance(model);
  const double rel = test::rel_diff(out.last_hidden_state, e.file.get("last_hidden_state"));
  std::printf("%s bf16: relative error %.3g (tolerance %.3g)\n", GetParam().c_str(), rel, tol);
  EXPECT_LT(rel, tol);
  if (out.logits.defined()) {
    EXPECT_LT(test::rel_diff(out.logits, e.file.get("logits")), tol);
  }
  // bf16 really ran: the result differs from fp32.
  HfEncoder fp32 = load_hf_encoder(hf_dir() + "/" + GetParam());
  HfEncoderCache cache32;
  EXPECT_GT(test::rel_diff(out.last_hidden_state, hf_encoder_forward(fp32, e.inputs, cache32).last_hidden_state), 0);
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfParity,
                         ::testing::Values("bert", "bert_nopool_tanh", "bert_cls", "roberta", "roberta_cls", "xlmr",
                                           "xlmr_cls_multilabel", "distilbert", "distilbert_sin_cls"));

// The unpadded sequences of a fixture's padded inputs.
std::vector<HfSequence> sequences_of(const HfInputs& in) {
  const int64_t B = in.input_ids.size(0), T = in.input_ids.size(1);
  const int64_t* ids = in.input_ids.data<int64_t>();
  const int64_t* mask = in.attention_mask.data<int64_t>();
  const int64_t* types = in.token_type_ids.data<int64_t>();
  std::vector<HfSequence> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T && mask[b * T + t]; ++t) {
      out[static_cast<size_t>(b)].input_ids.push_back(ids[b * T + t]);
      out[static_cast<size_t>(b)].token_type_ids.push_back(types[b * T + t]);
    }
  return out;
}

// Row b of a [n, T, E] tensor at its first `len` positions, as floats.
std::vector<float> valid_rows(const Tensor& h, int64_t b, int64_t len) {
  return h.select(0, b).narrow(0, 0, len).contiguous().to_vector();
}

TEST(HfPipeline, SortedBatchesMatchTransformersAndEachOther) {
  test::ScopedThreads threads(2);
  for (const std::string name : {"bert", "roberta", "distilbert_sin_cls"}) {
    SCOPED_TRACE(name);
    const HfEncoder model = load_hf_encoder(hf_dir() + "/" + name);
    const Expected e = load_expected(name);
    const std::vector<HfSequence> seqs = sequences_of(e.inputs);
    const Tensor& expected = e.file.get("last_hidden_state");
    const HfHiddenStates ref = hf_hidden_states(model, seqs, {1, {}});
    ASSERT_EQ(ref.last_hidden_state.size(1),
              static_cast<int64_t>(std::max_element(seqs.begin(), seqs.end(), [](auto& a, auto& b) {
                                     return a.input_ids.size() < b.input_ids.size();
                                   })->input_ids.size()));
    const double tol = fp32_tolerance(model);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int64_t len = static_cast<int64_t>(seqs[b].input_ids.size());
      const std::vector<float> got = valid_rows(ref.last_hidden_state, static_cast<int64_t>(b), len);
      const std::vector<float> want = valid_rows(expected, static_cast<int64_t>(b), len);
      EXPECT_CLOSE(Tensor::from_vector(got, {len, model.hidden_size()}),
                   Tensor::from_vector(want, {len, model.hidden_size()}), tol, tol);
      // Padding is never computed: zeros there, and the mask says where.
      const int64_t T = ref.last_hidden_state.size(1);
      for (int64_t t = 0; t < T; ++t) EXPECT_EQ(ref.attention_mask.data<int64_t>()[b * T + t], t < len ? 1 : 0);
      if (len < T) {
        EXPECT_EQ(ref.last_hidden_state.select(0, static_cast<int64_t>(b)).select(0, len).at({0}), 0.0f);
      }
    }
    // Every batch size, and the inputs in another order, give the same numbers. The products'
    // rows never mix and padded keys are skipped, so only the GEMM library's choice of kernel for
    // a different row count may change the rounding: allow a few units of the last place.
    int64_t done_calls = 0;
    for (int64_t batch : {2, 3, 4, 32}) {
      HfBatchOptions options{batch, [&](int64_t done, int64_t total) {
                               ++done_calls;
                               EXPECT_LE(done, total);
                             }};
      const HfHiddenStates h = hf_hidden_states(model, seqs, options);
      EXPECT_CLOSE(h.last_hidden_state, ref.last_hidden_state, 1e-6, 1e-6);
    }
    EXPECT_GT(done_calls, 4);
    std::vector<size_t> perm(seqs.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = (i * 5 + 3) % perm.size();
    std::vector<HfSequence> shuffled;
    for (size_t i : perm) shuffled.push_back(seqs[i]);
    const HfHiddenStates hs = hf_hidden_states(model, shuffled, {4, {}});
    for (size_t i = 0; i < perm.size(); ++i)
      EXPECT_CLOSE(hs.last_hidden_state.select(0, static_cast<int64_t>(i)),
                   ref.last_hidden_state.select(0, static_cast<int64_t>(perm[i])), 1e-6, 1e-6);
    if (model.has_classifier()) {
      const Tensor logits = hf_logits(model, seqs, {3, {}});
      EXPECT_CLOSE(logits, e.file.get("logits"), tol, tol);
    }
  }
}

TEST(HfPipeline, PoolingAsSentenceTransformers) {
  const HfEncoder model = load_hf_encoder(hf_dir() + "/bert");
  const Expected e = load_expected("bert");
  const std::vector<HfSequence> seqs = sequences_of(e.inputs);
  const Tensor& h = e.file.get("last_hidden_state");
  const int64_t E = model.hidden_size();
  const Tensor mean = hf_embed(model, seqs, HfPooling::kMean, false, {2, {}});
  const Tensor cls = hf_embed(model, seqs, HfPooling::kCls, true, {2, {}});
  const double tol = fp32_tolerance(model);
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t len = static_cast<int64_t>(seqs[b].input_ids.size());
    std::vector<float> want_mean(static_cast<size_t>(E)), want_cls(static_cast<size_t>(E));
    double norm = 0;
    for (int64_t j = 0; j < E; ++j) {
      double s = 0;
      for (int64_t t = 0; t < len; ++t) s += h.at({static_cast<int64_t>(b), t, j});
      want_mean[static_cast<size_t>(j)] = static_cast<float>(s / static_cast<double>(len));
      want_cls[static_cast<size_t>(j)] = h.at({static_cast<int64_t>(b), 0, j});
      norm += double{want_cls[static_cast<size_t>(j)]} * want_cls[static_cast<size_t>(j)];
    }
    for (float& v : want_cls) v = static_cast<float>(v / std::sqrt(norm));
    EXPECT_CLOSE(mean.select(0, static_cast<int64_t>(b)), Tensor::from_vector(want_mean, {E}), tol, tol);
    EXPECT_CLOSE(cls.select(0, static_cast<int64_t>(b)), Tensor::from_vector(want_cls, {E}), tol, tol);
  }
}

// Batch streams (hf_batch_streams): the same batches run two at a time, one per thread, give the
// one-stream numbers up to the products' rounding; consume and progress see every batch once, one
// at a time; an exception from a batch comes back to the caller; the caller's thread count stays.
TEST(HfPipeline, BatchStreamsMatchOneStream) {
  test::ScopedThreads threads(2);
  const HfEncoder model = load_hf_encoder(hf_dir() + "/bert");
  const Expected e = load_expected("bert");
  std::vector<HfSequence> seqs = sequences_of(e.inputs);
  const std::vector<HfSequence> base = seqs;
  for (int copy = 0; copy < 3; ++copy) seqs.insert(seqs.end(), base.begin(), base.end());
  const int64_t n = static_cast<int64_t>(seqs.size());
  int one_stream_calls = 0;
  const HfHiddenStates one = hf_hidden_states(model, seqs, {1, [&](int64_t, int64_t) { ++one_stream_calls; }, 1});
  EXPECT_EQ(one_stream_calls, n);

  int64_t last = 0, calls = 0;
  bool in_parallel = false;
  const HfBatchOptions two_streams{1,
                                   [&](int64_t done, int64_t total) {
                                     ++calls;
                                     EXPECT_GT(done, last);
                                     EXPECT_EQ(total, n);
                                     last = done;
                                     in_parallel |= omp_in_parallel() != 0;
                                   },
                                   2};
  const HfHiddenStates two = hf_hidden_states(model, seqs, two_streams);
  EXPECT_EQ(calls, n);
  EXPECT_EQ(last, n);
  EXPECT_TRUE(in_parallel);  // the batches ran in the streams' parallel region
  EXPECT_CLOSE(two.last_hidden_state, one.last_hidden_state, 1e-6, 1e-6);
  for (int64_t i = 0; i < one.attention_mask.numel(); ++i)
    EXPECT_EQ(two.attention_mask.data<int64_t>()[i], one.attention_mask.data<int64_t>()[i]);
  EXPECT_CLOSE(hf_embed(model, seqs, HfPooling::kMean, true, {3, {}, 2}),
               hf_embed(model, seqs, HfPooling::kMean, true, {3, {}, 1}), 1e-6, 1e-6);
  EXPECT_EQ(num_threads(), 2);

  int consumed = 0;
  EXPECT_THROW(hf_run_batches(model, seqs, {1, {}, 2},
                              [&](const std::vector<size_t>&, const HfOutputs&) {
                                if (++consumed == 3) throw Error("stop");
                              }),
               Error);
  EXPECT_LT(consumed, n);  // the batches not yet started when it threw never ran
  EXPECT_EQ(num_threads(), 2);
}

TEST(HfPipeline, BatchStreamCount) {
  EXPECT_EQ(hf_batch_streams(2, 32, 0), 2);  // cabm embed's 1,000 texts in batches of 32
  EXPECT_EQ(hf_batch_streams(2, 7, 0), 1);   // too few batches to even out two streams
  EXPECT_EQ(hf_batch_streams(1, 100, 0), 1);
  EXPECT_EQ(hf_batch_streams(4, 16, 0), 4);
  EXPECT_EQ(hf_batch_streams(2, 3, 5), 2);  // asked for: at most the threads
  EXPECT_EQ(hf_batch_streams(4, 100, 1), 1);
  EXPECT_THROW(hf_batch_streams(2, 10, -1), Error);
}

TEST(HfConfig, LabelsAndProblemType) {
  const HfEncoderConfig multi = read_hf_config(hf_dir() + "/xlmr_cls_multilabel");
  EXPECT_TRUE(multi.multi_label);
  EXPECT_EQ(multi.family, HfFamily::kRoberta);
  EXPECT_EQ(multi.id2label, (std::vector<std::string>{"sports", "politics", "science", "art"}));
  const HfEncoderConfig single = read_hf_config(hf_dir() + "/distilbert_sin_cls");
  EXPECT_FALSE(single.multi_label);
  EXPECT_TRUE(single.sinusoidal_pos_embds);
  EXPECT_EQ(single.activation, HfActivation::kRelu);
  EXPECT_EQ(single.pad_token_id, 2);
  const HfEncoderConfig tanh = read_hf_config(hf_dir() + "/bert_nopool_tanh");
  EXPECT_EQ(tanh.activation, HfActivation::kGeluTanh);
  EXPECT_FLOAT_EQ(tanh.layer_norm_eps, 1e-5f);
  EXPECT_EQ(tanh.max_tokens(), 40);
  EXPECT_EQ(read_hf_config(hf_dir() + "/roberta").max_tokens(), 40 - 1 - 1);
}

TEST(HfPipeline, Probabilities) {
  const Tensor logits = Tensor::from_vector({0.0f, std::log(3.0f), 100.0f, -100.0f}, {2, 2});
  const Tensor soft = hf_probabilities(logits, false);
  EXPECT_NEAR(soft.at({0, 0}), 0.25, 1e-7);
  EXPECT_NEAR(soft.at({0, 1}), 0.75, 1e-7);
  EXPECT_NEAR(soft.at({1, 0}), 1.0, 1e-7);
  const Tensor sig = hf_probabilities(logits, true);
  EXPECT_NEAR(sig.at({0, 0}), 0.5, 1e-7);
  EXPECT_NEAR(sig.at({0, 1}), 0.75, 1e-7);
  EXPECT_NEAR(sig.at({1, 1}), 0.0, 1e-7);
}

// The real checkpoint, through the library with sentence-transformers' own token ids.
TEST(HfMiniLM, EmbeddingsMatchSentenceTransformers) {
  test::ScopedThreads threads(2);
  const std::string dir = test::read_file(hf_dir() + "/minilm_dir.txt");
  ASSERT_FALSE(dir.empty());
  const SentenceTransformersConfig st = read_sentence_transformers_config(dir);
  EXPECT_TRUE(st.present);
  EXPECT_EQ(st.pooling, HfPooling::kMean);
  EXPECT_TRUE(st.normalize);
  EXPECT_EQ(st.max_seq_length, 256);
  const HfEncoder model = load_hf_encoder(dir);
  const SafetensorsFile e = read_safetensors(hf_dir() + "/minilm.expected.safetensors");
  const HfInputs in{e.get("input_ids"), e.get("token_type_ids"), e.get("attention_mask")};
  const Tensor emb = hf_embed(model, sequences_of(in), st.pooling, st.normalize, {4, {}});
  EXPECT_CLOSE(emb, e.get("embeddings"), 1e-5, 2e-6);
  HfEncoder bf16 = load_hf_encoder(dir);
  set_precision(bf16, Precision::kBf16);
  const Tensor emb16 = hf_embed(bf16, sequences_of(in), st.pooling, st.normalize, {4, {}});
  const double rel = test::rel_diff(emb16, e.get("embeddings"));
  std::printf("all-MiniLM-L6-v2 bf16: relative error %.3g\n", rel);
  EXPECT_LT(rel, std::ldexp(1.0, -8) * std::sqrt(7.0));  // as bf16_rel_tolerance, L = 6
  EXPECT_GT(rel, 1e-5);
}

// ---- refusals ----------------------------------------------------------------------------------

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream(p) << j.dump(2);
}

// A copy of a fixture model directory, with its config edited.
fs::path copy_model(const std::string& name, const std::string& to,
                    const std::function<void(nlohmann::json&)>& edit = nullptr) {
  const fs::path dst = fs::path(test::temp_dir()) / to;
  fs::remove_all(dst);
  fs::create_directories(dst);
  fs::copy(fs::path(hf_dir()) / name, dst, fs::copy_options::recursive);
  if (edit) {
    nlohmann::json config = read_json(dst / "config.json");
    edit(config);
    write_json(dst / "config.json", config);
  }
  return dst;
}

// The model's weights rewritten with one tensor removed or replaced.
void edit_weights(const fs::path& dir, const std::string& key, const Tensor* replacement) {
  SafetensorsFile f = read_safetensors((dir / "model.safetensors").string());
  f.tensors.erase(key);
  if (replacement) f.tensors[key] = *replacement;
  write_safetensors((dir / "model.safetensors").string(), f.tensors, f.metadata);
}

void expect_refused(const fs::path& dir, const std::vector<std::string>& needles) {
  const std::string message = test::error_of([&] { load_hf_encoder(dir); });
  ASSERT_FALSE(message.empty()) << dir << " was loaded";
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& needle : needles) EXPECT_NE(message.find(needle), std::string::npos) << message;
}

TEST(HfRefusals, PickleOnly) {
  const fs::path dir = copy_model("bert", "pickle");
  fs::remove(dir / "model.safetensors");
  std::ofstream(dir / "pytorch_model.bin") << "PK";
  expect_refused(dir, {"pytorch_model.bin", "pickle", "execute code"});
}

TEST(HfRefusals, MissingFiles) {
  expect_refused(fs::path(test::temp_dir()) / "no-such-dir", {"no-such-dir", "not a directory"});
  const fs::path dir = copy_model("bert", "nofiles");
  fs::remove(dir / "model.safetensors");
  expect_refused(dir, {"model.safetensors"});
  fs::remove(dir / "config.json");
  expect_refused(dir, {"config.json"});
}

TEST(HfRefusals, ArchitectureAndOptions) {
  using J = nlohmann::json;
  struct Case {
    std::string name, key;
    std::function<void(J&)> edit;
  };
  const std::vector<Case> cases = {
      {"arch", "architectures", [](J& c) { c["architectures"] = J::array({"BertForMaskedLM"}); }},
      {"type", "model_type",
       [](J& c) {
         c.erase("architectures");
         c["model_type"] = "albert";
       }},
      {"act", "hidden_act", [](J& c) { c["hidden_act"] = "swish"; }},
      {"pos", "position_embedding_type", [](J& c) { c["position_embedding_type"] = "relative_key"; }},
      {"decoder", "is_decoder", [](J& c) { c["is_decoder"] = true; }},
      {"heads", "num_attention_heads", [](J& c) { c["num_attention_heads"] = 5; }},
      {"eps", "layer_norm_eps", [](J& c) { c["layer_norm_eps"] = "small"; }},
      {"layers", "num_hidden_layers", [](J& c) { c["num_hidden_layers"] = 2.5; }},
      {"missing", "hidden_size", [](J& c) { c.erase("hidden_size"); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_refused(copy_model("bert", "cfg_" + c.name, c.edit), {"config.json", "'" + c.key + "'"});
  }
  expect_refused(copy_model("distilbert", "cfg_dact", [](J& c) { c["activation"] = "silu"; }), {"'activation'"});
  expect_refused(copy_model("bert_cls", "cfg_problem", [](J& c) { c["problem_type"] = "regression"; }),
                 {"'problem_type'"});
}

TEST(HfRefusals, MissingTensor) {
  const fs::path dir = copy_model("bert", "missing_tensor");
  edit_weights(dir, "encoder.layer.1.output.dense.weight", nullptr);
  expect_refused(dir, {"model.safetensors", "'encoder.layer.1.output.dense.weight'", "missing"});
  const fs::path cls = copy_model("roberta_cls", "missing_head");
  edit_weights(cls, "classifier.out_proj.bias", nullptr);
  expect_refused(cls, {"'classifier.out_proj.bias'"});
}

TEST(HfRefusals, WrongShape) {
  const fs::path dir = copy_model("distilbert", "wrong_shape");
  const Tensor bad = Tensor::zeros({32, 33});
  edit_weights(dir, "transformer.layer.0.attention.k_lin.weight", &bad);
  expect_refused(dir, {"model.safetensors", "'transformer.layer.0.attention.k_lin.weight'", "[32, 33]", "[32, 32]"});
  // A table that does not match config.json's sizes.
  const fs::path vocab = copy_model("bert", "wrong_vocab", [](nlohmann::json& c) { c["vocab_size"] = 98; });
  expect_refused(vocab, {"'embeddings.word_embeddings.weight'", "[97, 32]", "[98, 32]"});
}

TEST(HfRefusals, UnexpectedTensor) {
  const fs::path dir = copy_model("bert", "unexpected");
  const Tensor extra = Tensor::zeros({4});
  edit_weights(dir, "encoder.layer.2.output.dense.bias", &extra);
  expect_refused(dir, {"unexpected tensor", "'encoder.layer.2.output.dense.bias'"});
}

// A NaN or ±inf weight (F32, or BF16 as some checkpoints store them) made every output NaN with
// exit 0. The word embeddings, used as read rather than copied, are checked as well.
TEST(HfRefusals, NonFiniteWeights) {
  struct Case {
    std::string model, key;
    float value;
    bool bf16;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {{"bert", "encoder.layer.1.output.dense.weight", std::nanf(""), false},
                                   {"bert", "embeddings.word_embeddings.weight", inf, false},
                                   {"distilbert", "transformer.layer.0.attention.k_lin.bias", -inf, true},
                                   {"roberta_cls", "classifier.out_proj.weight", std::nanf(""), true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const fs::path dir = copy_model(c.model, "nonfinite");
    Tensor t = read_safetensors((dir / "model.safetensors").string()).get(c.key).clone();
    t.data<float>()[6] = c.value;
    if (c.bf16) {
      Tensor b = Tensor::empty(t.shape(), DType::BF16);
      for (int64_t i = 0; i < t.numel(); ++i) b.data<bf16>()[i] = float_to_bf16(t.data<float>()[i]);
      t = b;
    }
    edit_weights(dir, c.key, &t);
    expect_refused(dir, {fmt::format("model.safetensors: tensor '{}' holds {} at element 6 (a model's weights must "
                                     "be finite)",
                                     c.key, c.value)});
  }
}

// bert_cls_tok with one embedding table cut to its first `rows` rows and its config key to match.
fs::path cut_table(const std::string& to, const std::string& config_key, const std::string& table, int64_t rows) {
  const fs::path dir = copy_model("bert_cls_tok", to, [&](nlohmann::json& c) { c[config_key] = rows; });
  const Tensor cut = read_safetensors((dir / "model.safetensors").string()).get(table).narrow(0, 0, rows).clone();
  edit_weights(dir, table, &cut);
  return dir;
}

TEST(HfRefusals, TokensOutsideTheModelsTables) {
  // A model with one token type given sentence pairs (BERT's second text has type 1), and a model
  // whose vocabulary is smaller than its tokenizer's: transformers fails with an IndexError in
  // its embedding; cabm names the input line and the config key before running anything.
  const fs::path one_type = cut_table("one_type", "type_vocab_size", "bert.embeddings.token_type_embeddings.weight", 1);
  const HfEncoder model = load_hf_encoder(one_type);
  const HfTokenizer tokenizer = HfTokenizer::load(one_type);
  EXPECT_EQ(hf_tokenize(tokenizer, model, {"one", "two"}, {}, 0, "in.txt").size(), 2u);  // single texts: type 0
  const std::string pair_error = test::error_of([&] {
    hf_tokenize(tokenizer, model, {"one", "two"}, {"", "second"}, 0, "in.txt");
  });
  EXPECT_NE(pair_error.find("in.txt: line 1: token type 1 (the pair's second text) is outside the 1 token type of"),
            std::string::npos)
      << pair_error;
  EXPECT_NE(pair_error.find("config.json (type_vocab_size)"), std::string::npos) << pair_error;

  const fs::path small = cut_table("small_vocab", "vocab_size", "bert.embeddings.word_embeddings.weight", 1000);
  const HfEncoder small_model = load_hf_encoder(small);
  const HfTokenizer small_tokenizer = HfTokenizer::load(small);
  // [CLS] is 101, "[SEP]" 102 in this vocabulary; "the" is 1996.
  EXPECT_EQ(hf_tokenize(small_tokenizer, small_model, {""}, {}, 0, "in.txt").size(), 1u);
  const std::string id_error = test::error_of([&] {
    hf_tokenize(small_tokenizer, small_model, {"", "the"}, {}, 0, "in.txt");
  });
  EXPECT_NE(id_error.find("in.txt: line 2: the tokenizer gave token id 1996, outside the 1000 ids of"),
            std::string::npos)
      << id_error;
  EXPECT_NE(id_error.find("(vocab_size)"), std::string::npos) << id_error;
}

TEST(HfRefusals, BadInputs) {
  const HfEncoder model = load_hf_encoder(hf_dir() + "/bert");
  HfEncoderCache cache;
  Tensor ids = Tensor::zeros({1, 3}, DType::I64);
  ids.data<int64_t>()[1] = 97;
  EXPECT_NE(test::error_of([&] {
              hf_encoder_forward(model, {ids, {}, {}}, cache);
            }).find("input_ids[0, 1] is 97"),
            std::string::npos);
  const Tensor too_long = Tensor::zeros({1, 41}, DType::I64);
  EXPECT_NE(test::error_of([&] {
              hf_encoder_forward(model, {too_long, {}, {}}, cache);
            }).find("40 positions"),
            std::string::npos);
  Tensor types = Tensor::zeros({1, 3}, DType::I64);
  types.data<int64_t>()[2] = 3;
  ids.data<int64_t>()[1] = 5;
  EXPECT_NE(test::error_of([&] {
              hf_encoder_forward(model, {ids, types, {}}, cache);
            }).find("token_type_ids[0, 2]"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              hf_encoder_forward(model, {Tensor::zeros({3}), {}, {}}, cache);
            }).find("input_ids"),
            std::string::npos);
}

}  // namespace
}  // namespace cabm
