// AdamW, learning-rate schedules and gradient clipping against hand-computed values and an
// independent double-precision reference of the textbook formulas.
#include "cabm/train/adamw.h"
#include "cabm/train/grad_clip.h"
#include "cabm/train/schedule.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

NamedTensors one(const std::string& name, const Tensor& t) {
  return {{name, t}};
}

TEST(AdamW, FirstStepByHand) {
  // p = [1, -2] (a matrix, so it decays), g = [0.5, -0.1], lr 0.1, wd 0.01.
  // Step 1: bias corrections make the update lr·g/|g| = ±0.1 (up to eps); decay first:
  // p·(1 − 0.001) = [0.999, −1.998]; then p − 0.1·sign(g) = [0.899, −1.898].
  Tensor p = Tensor::from_vector({1.0f, -2.0f}, {1, 2});
  Tensor g = Tensor::from_vector({0.5f, -0.1f}, {1, 2});
  AdamW opt = make_adamw(one("w.weight", p), AdamWConfig{});
  ASSERT_EQ(opt.weight_decay[0], 0.01);
  adamw_step(opt, one("w.weight", p), one("w.weight", g), 0.1);
  EXPECT_EQ(opt.step, 1);
  EXPECT_NEAR(p.at({0, 0}), 0.899f, 1e-6);
  EXPECT_NEAR(p.at({0, 1}), -1.898f, 1e-6);
  EXPECT_NEAR(opt.exp_avg[0].at({0, 0}), 0.05f, 1e-8);         // (1 − β1)·g
  EXPECT_NEAR(opt.exp_avg_sq[0].at({0, 0}), 0.00025f, 1e-10);  // (1 − β2)·g²
}

TEST(AdamW, NoDecayOnBiasNormAndEmbeddings) {
  const Tensor matrix = Tensor::zeros({4, 4}), vector = Tensor::zeros({4});
  EXPECT_TRUE(default_weight_decay("encoder.layers.0.linear1.weight", matrix));
  EXPECT_TRUE(default_weight_decay("encoder.layers.0.self_attn.in_proj_weight", matrix));
  EXPECT_FALSE(default_weight_decay("encoder.layers.0.linear1.bias", vector));
  EXPECT_FALSE(default_weight_decay("encoder.norm.weight", vector));
  EXPECT_FALSE(default_weight_decay("embed.weight", matrix));
  EXPECT_FALSE(default_weight_decay("pos_embed.weight", matrix));

  // A bias with zero gradient stays put; a matrix with zero gradient only decays.
  Tensor bias = Tensor::full({3}, 2.0f), weight = Tensor::full({1, 3}, 2.0f);
  const NamedTensors params = {{"l.bias", bias}, {"l.weight", weight}};
  const NamedTensors grads = {{"l.bias", Tensor::zeros({3})}, {"l.weight", Tensor::zeros({1, 3})}};
  AdamW opt = make_adamw(params, AdamWConfig{});
  adamw_step(opt, params, grads, 0.5);
  EXPECT_EQ(bias.at({0}), 2.0f);
  EXPECT_FLOAT_EQ(weight.at({0, 0}), 2.0f * (1.0f - 0.5f * 0.01f));
}

TEST(AdamW, MatchesDoubleReferenceOverManySteps) {
  const int64_t n = 37;
  Tensor p = test::random_tensor({n, 1}, 1);
  const std::vector<float> initial = p.to_vector();
  std::vector<double> ref(initial.begin(), initial.end()), m(n, 0.0), v(n, 0.0);
  AdamWConfig config;
  config.weight_decay = 0.1;
  const NamedTensors params = one("x.weight", p);
  AdamW opt = make_adamw(params, config);
  for (int step = 1; step <= 20; ++step) {
    Tensor g = test::random_tensor({n, 1}, 100 + step, -2.0f, 2.0f);
    const double lr = 0.01 / step;
    adamw_step(opt, params, one("x.weight", g), lr);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g.at({i, 0});
      ref[i] *= 1.0 - lr * config.weight_decay;
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.999 * v[i] + 0.001 * gi * gi;
      const double mhat = m[i] / (1.0 - std::pow(0.9, step)), vhat = v[i] / (1.0 - std::pow(0.999, step));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(p.at({i, 0}), ref[i], 1e-6 * (1 + std::fabs(ref[i]))) << i;
}

TEST(AdamW, ChecksNames) {
  Tensor p = Tensor::zeros({2});
  AdamW opt = make_adamw(one("a", p), AdamWConfig{});
  EXPECT_THROW(adamw_step(opt, one("a", p), one("b", Tensor::zeros({2})), 0.1), Error);
  EXPECT_THROW(adamw_step(opt, one("a", p), one("a", Tensor::zeros({3})), 0.1), Error);
}

TEST(Schedule, SeedWarmup) {
  ScheduleConfig c;
  c.kind = ScheduleKind::kWarmup;
  c.scale = 1.0;
  c.d_model = 512;
  c.warmup = 4000;
  // lr = E^-0.5 · min(t^-0.5, t · w^-1.5)
  EXPECT_NEAR(learning_rate(c, 1), std::pow(512.0, -0.5) * std::pow(4000.0, -1.5), 1e-15);
  EXPECT_NEAR(learning_rate(c, 4000), std::pow(512.0, -0.5) * std::pow(4000.0, -0.5), 1e-15);
  EXPECT_NEAR(learning_rate(c, 16000), std::pow(512.0, -0.5) * std::pow(16000.0, -0.5), 1e-15);
  EXPECT_NEAR(learning_rate(c, 4000), 6.9877e-4, 1e-8);
  // The peak-lr parametrisation puts exactly `peak` at t = warmup.
  c.scale = warmup_scale_for_peak(3e-3, 512, 4000);
  EXPECT_NEAR(learning_rate(c, 4000), 3e-3, 1e-15);
  EXPECT_LT(learning_rate(c, 3999), 3e-3);
  EXPECT_LT(learning_rate(c, 4001), 3e-3);
}

TEST(Schedule, CosineAndConstant) {
  ScheduleConfig c;
  c.kind = ScheduleKind::kCosine;
  c.lr = 1.0;
  c.warmup = 10;
  c.total_steps = 110;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 5), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);
  EXPECT_NEAR(learning_rate(c, 60), 0.55, 1e-12);  // halfway: min + (1 − min)/2
  EXPECT_NEAR(learning_rate(c, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(c, 500), 0.1, 1e-12);  // held after the end
  c.kind = ScheduleKind::kConstant;
  EXPECT_EQ(learning_rate(c, 7), 1.0);
  EXPECT_EQ(parse_schedule("noam"), ScheduleKind::kWarmup);
  EXPECT_THROW(parse_schedule("linear"), Error);
  EXPECT_THROW(learning_rate(c, 0), Error);
}

TEST(GradClip, TorchSemantics) {
  // Two tensors, norms 5 and 12: total 13.
  Tensor a = Tensor::from_vector({3.0f, 4.0f}, {2}), b = Tensor::from_vector({12.0f}, {1});
  NamedTensors grads = {{"a", a}, {"b", b}};
  EXPECT_FLOAT_EQ(clip_grad_norm(grads, 20.0f), 13.0f);  // coef > 1: untouched
  EXPECT_EQ(a.at({0}), 3.0f);
  EXPECT_FLOAT_EQ(clip_grad_norm(grads, 6.5f), 13.0f);
  const float coef = 6.5f / (13.0f + 1e-6f);
  EXPECT_FLOAT_EQ(a.at({0}), 3.0f * coef);
  EXPECT_FLOAT_EQ(b.at({0}), 12.0f * coef);
  EXPECT_NEAR(global_grad_norm(grads), 6.5, 1e-5);
  // max_norm <= 0 only measures.
  EXPECT_NEAR(clip_grad_norm(grads, 0.0f), 6.5, 1e-5);
  EXPECT_FLOAT_EQ(a.at({0}), 3.0f * coef);
}

TEST(GradClip, SameForEveryThreadCount) {
  Tensor big = test::random_tensor({300000}, 7);
  const NamedTensors grads = {{"g", big}};
  float norms[3];
  for (int t = 1; t <= 3; ++t) {
    test::ScopedThreads threads(t);
    norms[t - 1] = global_grad_norm(grads);
  }
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_EQ(norms[0], norms[2]);
}

}  // namespace
}  // namespace cabm
