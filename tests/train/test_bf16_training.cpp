// Mixed-precision training: a tiny causal LM trained 40 steps in bf16 tracks the same run in
// fp32 (same initialisation, same batches, same dropout streams).
//
// Criteria, and why:
// * Step 1 starts from identical weights, so the two losses differ only by the forward pass's
//   rounding. Cross-entropy is 2-Lipschitz in the ∞-norm of the logits (∂L/∂z = p − onehot, whose
//   1-norm is at most 2), and to first order the logits move by at most S·3u·max|z| (S bf16
//   product stages per layer times layers plus the head, 3u per stage: see
//   tests/nn/test_mixed_precision.cpp), so |L_bf16 − L_fp32| <= 2·S·3u·max|z| at step 1.
// * Afterwards the trajectories separate (different rounding → different updates), so no
//   per-step bound holds; what matters is that the optimisation makes the same progress. Over the
//   last 10 steps the bf16 mean loss must be within 5% of the fp32 run's total progress
//   (L_1 − mean of its last 10) from the fp32 mean: bf16 gets at least 95% of the way.
// * Both must actually learn (the fp32 mean of the last 10 steps at least 0.5 nats below L_1),
//   and the fp32 master weights must differ from their bf16 copies only by one rounding (the
//   copies are refreshed after every step).
#include "cabm/nn/mixed_precision.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/lm_trainer.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

constexpr double kU = 1.0 / 256;  // bf16 unit roundoff 2^-8 (8 significant bits)

TextSplit tiny_corpus() {
  TextSplit split;
  split.source = "test";
  const char* lines[] = {"the cat sat on the mat.\n", "a dog ate the bone.\n", "the bird sang a song.\n",
                         "one fish, two fish, red fish, blue fish.\n"};
  for (int i = 0; i < 300; ++i) split.train += lines[(i * 7) % 4];
  for (int i = 0; i < 20; ++i) split.validation += lines[i % 4];
  split.train_documents = split.validation_documents = 1;
  return split;
}

TrainConfig tiny_config(Precision precision) {
  TrainConfig c = default_train_config(TrainTask::kLanguageModel);
  c.layers = 2;
  c.heads = 4;
  c.d_model = 32;
  c.d_ff = 64;
  c.seq_len = 32;
  c.batch_size = 8;
  c.steps = 40;
  c.schedule.lr = 3e-3;
  c.schedule.warmup = 5;
  c.dropout = 0.1f;  // dropout streams are shared too
  c.precision = precision;
  return c;
}

TEST(Bf16Training, LossTracksFp32) {
  LmTrainer fp32(tiny_config(Precision::kFp32), tiny_corpus());
  LmTrainer bf16(tiny_config(Precision::kBf16), tiny_corpus());
  ASSERT_EQ(precision_of(bf16.model()), Precision::kBf16);
  ASSERT_EQ(precision_of(fp32.model()), Precision::kFp32);

  // Step 1 on a fixed batch, whose fp32 logits give max|z| for the bound.
  const TrainConfig c = tiny_config(Precision::kFp32);
  Tensor inputs = Tensor::empty({c.batch_size, c.seq_len}, DType::I64);
  Tensor targets = Tensor::empty({c.batch_size, c.seq_len}, DType::I64);
  Rng rng(99);
  sample_windows(fp32.data().train, c.batch_size, c.seq_len, rng, inputs.data<int64_t>(), targets.data<int64_t>());
  CausalLMCache cache;
  double max_logit = 0;
  for (float z : causal_lm_forward(fp32.model(), inputs, cache).to_vector())
    max_logit = std::max(max_logit, double(std::fabs(z)));
  std::vector<double> a{fp32.train_step_on({inputs}, {targets}).loss}, b{bf16.train_step_on({inputs}, {targets}).loss};
  const int64_t stages = 6 * c.layers + 1;  // per layer: attention 4 + feed-forward 2; the head
  EXPECT_LE(std::fabs(b[0] - a[0]), 2.0 * stages * 3 * kU * max_logit) << a[0] << " vs " << b[0];
  for (int64_t step = 1; step < 40; ++step) {
    a.push_back(fp32.train_step().loss);
    b.push_back(bf16.train_step().loss);
  }

  auto tail_mean = [](const std::vector<double>& v) {
    double s = 0;
    for (size_t i = v.size() - 10; i < v.size(); ++i) s += v[i];
    return s / 10;
  };
  const double end32 = tail_mean(a), end16 = tail_mean(b), progress = a[0] - end32;
  EXPECT_GT(progress, 0.5) << "fp32 did not learn: " << a[0] << " → " << end32;
  EXPECT_LE(std::fabs(end16 - end32), 0.05 * progress) << "fp32 " << end32 << ", bf16 " << end16;
  for (const auto& [key, value] : {std::pair<const char*, double>{"step1_fp32", a[0]},
                                   {"step1_bf16", b[0]},
                                   {"last10_fp32", end32},
                                   {"last10_bf16", end16}})
    RecordProperty(key, std::to_string(value));  // in --gtest_output=xml

  // The bf16 copies are the rounded master weights after the last step.
  const CausalLM& m = bf16.model();
  const std::vector<float> master = m.encoder.layers[0].ffn.linear1.weight.to_vector();
  const std::vector<float> copy = m.encoder.layers[0].ffn.linear1.weight_bf16.to_vector();
  for (size_t i = 0; i < master.size(); ++i) ASSERT_LE(std::fabs(copy[i] - master[i]), kU * std::fabs(master[i]));
  const std::vector<float> head = m.embed.weight.to_vector(), head_copy = m.head.weight_bf16.to_vector();
  for (size_t i = 0; i < head.size(); ++i) ASSERT_LE(std::fabs(head_copy[i] - head[i]), kU * std::fabs(head[i]));
}

TEST(Bf16Training, PrecisionInTheSavedConfig) {
  TrainConfig c = tiny_config(Precision::kBf16);
  EXPECT_EQ(to_json(c).at("precision"), "bf16");
  EXPECT_EQ(train_config_from_json(to_json(c)).precision, Precision::kBf16);
  nlohmann::json old = to_json(tiny_config(Precision::kFp32));
  old.erase("precision");  // a checkpoint from before mixed precision
  EXPECT_EQ(train_config_from_json(old).precision, Precision::kFp32);
  old["precision"] = "fp16";
  EXPECT_THROW(train_config_from_json(old), Error);
  EXPECT_THROW(parse_precision("foo"), Error);
}

}  // namespace
}  // namespace cabm
