// Checkpoints: layout, atomicity (a crash at any point leaves a loadable `latest`), keep
// policy, clear errors for broken ones, and bit-exact resume: 2k steps straight equal
// k steps + save + restore + k steps, losses and weights, with dropout and accumulation on.
#include "cabm/nn/init.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/lm_trainer.h"
#include "cabm/train/model_config.h"
#include "util/test_util.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

namespace cabm {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string dir = test::temp_dir() + "/" + name;
  fs::remove_all(dir);
  return dir;
}

TextSplit tiny_text() {
  TextSplit t;
  t.source = "tiny";
  const std::string base =
      "the quick brown fox jumps over the lazy dog. pack my box with five dozen liquor jugs. "
      "how vexingly quick daft zebras jump! sphinx of black quartz, judge my vow.\n";
  for (int i = 0; i < 40; ++i)
    t.train += base.substr(static_cast<size_t>(i % 7)) + base.substr(0, static_cast<size_t>(i % 7));
  t.validation = base + base;
  return t;
}

TrainConfig tiny_config(const std::string& out) {
  TrainConfig c;
  c.out_dir = out;
  c.layers = 1;
  c.heads = 2;
  c.d_model = 16;
  c.d_ff = 32;
  c.seq_len = 16;
  c.batch_size = 4;
  c.accum = 2;
  c.dropout = 0.1f;  // exercises the dropout streams across the restart
  c.steps = 12;
  c.schedule.kind = ScheduleKind::kCosine;
  c.schedule.lr = 3e-3;
  c.schedule.warmup = 3;
  c.seed = 7;
  c.eval_windows = 4;
  return c;
}

using test::error_of;

TEST(Resume, BitExactAfterRestart) {
  test::ScopedThreads threads(2);
  const int64_t k = 6;
  // Uninterrupted: 2k steps.
  LmTrainer straight(tiny_config(fresh_dir("straight")), tiny_text());
  std::vector<double> expected;
  for (int64_t s = 0; s < 2 * k; ++s) expected.push_back(straight.train_step().loss);

  // k steps, checkpoint, a new process's worth of objects, restore, k more.
  const std::string out = fresh_dir("interrupted");
  {
    LmTrainer first(tiny_config(out), tiny_text());
    for (int64_t s = 0; s < k; ++s) EXPECT_EQ(first.train_step().loss, expected[static_cast<size_t>(s)]) << s;
    first.save();
  }
  LmTrainer second(tiny_config(out), tiny_text());
  second.restore(load_checkpoint(out, true));
  EXPECT_EQ(second.step(), k);
  for (int64_t s = k; s < 2 * k; ++s)
    EXPECT_EQ(second.train_step().loss, expected[static_cast<size_t>(s)]) << "step " << s + 1;
  // Weights and optimizer state agree bit for bit.
  for (size_t i = 0; i < straight.parameters().size(); ++i) {
    EXPECT_EQ(straight.parameters()[i].tensor.to_vector(), second.parameters()[i].tensor.to_vector())
        << straight.parameters()[i].name;
    EXPECT_EQ(straight.optimizer().exp_avg_sq[i].to_vector(), second.optimizer().exp_avg_sq[i].to_vector());
  }
  EXPECT_EQ(straight.data_position(), second.data_position());
  EXPECT_EQ(straight.evaluate(), second.evaluate());
}

// A trainer evaluates in its training cache (no fresh activations): validations between steps
// (6 windows in batches of 4: the last batch smaller than a training one) change no step's loss
// or weight, and each equals evaluate_lm in a fresh cache; in both precisions.
TEST(Resume, ValidationBetweenStepsChangesNothing) {
  test::ScopedThreads threads(2);
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    TrainConfig config = tiny_config(fresh_dir("no_eval"));
    config.precision = precision;
    config.eval_windows = 6;
    LmTrainer plain(config, tiny_text());
    config.out_dir = fresh_dir("with_eval");
    LmTrainer evaluated(config, tiny_text());
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(evaluated.train_step().loss, plain.train_step().loss) << "step " << s + 1;
      const double in_cache = evaluated.evaluate();
      EXPECT_TRUE(std::isfinite(in_cache));
      EXPECT_EQ(in_cache, evaluate_lm(evaluated.model(), tiny_text().validation, config.seq_len, config.eval_windows,
                                      config.batch_size));
    }
    for (size_t i = 0; i < plain.parameters().size(); ++i)
      EXPECT_EQ(plain.parameters()[i].tensor.to_vector(), evaluated.parameters()[i].tensor.to_vector())
          << plain.parameters()[i].name;
  }
}

TEST(Checkpoint, LayoutAndKeepPolicy) {
  const std::string out = fresh_dir("layout");
  LmTrainer trainer(tiny_config(out), tiny_text());
  for (int i = 0; i < 3; ++i) {
    trainer.train_step();
    trainer.save({{"val_loss", 1.5}});
  }
  // keep = 2: steps 2 and 3 remain; latest names 3.
  EXPECT_FALSE(fs::exists(out + "/step-00000001"));
  EXPECT_TRUE(fs::exists(out + "/step-00000002/model.safetensors"));
  for (const char* file : {kModelFile, kOptimizerFile, kStateFile})
    EXPECT_TRUE(fs::exists(out + "/step-00000003/" + file)) << file;
  EXPECT_EQ(resolve_checkpoint(out), out + "/step-00000003");
  EXPECT_EQ(resolve_checkpoint(out + "/step-00000002"), out + "/step-00000002");

  const LoadedCheckpoint c = load_checkpoint(out, true);
  EXPECT_EQ(c.state.at("step").get<int64_t>(), 3);
  EXPECT_EQ(c.state.at("metrics").at("val_loss").get<double>(), 1.5);
  EXPECT_EQ(c.model.get_metadata("model"), "CausalLM");
  EXPECT_EQ(c.model.get_metadata("d_model"), "16");
  EXPECT_EQ(c.optimizer->get_metadata("step"), "3");
  EXPECT_TRUE(c.optimizer->find("exp_avg.embed.weight") != nullptr);
  EXPECT_TRUE(c.optimizer->find("exp_avg_sq.encoder.norm.bias") != nullptr);
  // PyTorch names in the model file.
  EXPECT_TRUE(c.model.find("encoder.layers.0.self_attn.in_proj_weight") != nullptr);
  EXPECT_TRUE(c.model.find("pos_embed.weight") != nullptr);
}

TEST(Checkpoint, CrashLeftoversAreIgnoredAndCleaned) {
  const std::string out = fresh_dir("crash");
  LmTrainer trainer(tiny_config(out), tiny_text());
  trainer.train_step();
  trainer.save();
  // A crash while writing step 2: a half-written hidden directory...
  fs::create_directories(out + "/.tmp-step-00000002-abcdef");
  std::ofstream(out + "/.tmp-step-00000002-abcdef/model.safetensors") << "trunc";
  // ...and a crash after the directory rename but before `latest` moved on.
  fs::copy(out + "/step-00000001", out + "/step-00000005", fs::copy_options::recursive);
  EXPECT_EQ(resolve_checkpoint(out), out + "/step-00000001");
  EXPECT_NO_THROW(load_checkpoint(out, true));
  trainer.train_step();
  trainer.save();
  EXPECT_FALSE(fs::exists(out + "/.tmp-step-00000002-abcdef"));
  EXPECT_EQ(resolve_checkpoint(out), out + "/step-00000002");
  // Re-saving an existing step replaces it whole.
  trainer.save();
  EXPECT_EQ(resolve_checkpoint(out), out + "/step-00000002");
  EXPECT_NO_THROW(load_checkpoint(out, true));
}

TEST(Checkpoint, BrokenCheckpointsGiveClearErrors) {
  const std::string out = fresh_dir("broken");
  EXPECT_NE(error_of([&] { load_checkpoint(out, false); }).find("no such checkpoint directory"), std::string::npos);
  fs::create_directories(out);
  EXPECT_NE(error_of([&] { load_checkpoint(out, false); }).find("not a checkpoint"), std::string::npos);
  std::ofstream(out + "/latest") << "step-00000009\n";
  EXPECT_NE(error_of([&] { load_checkpoint(out, false); }).find("step-00000009"), std::string::npos);
  std::ofstream(out + "/latest") << "garbage\n";
  EXPECT_NE(error_of([&] { load_checkpoint(out, false); }).find("malformed"), std::string::npos);

  LmTrainer trainer(tiny_config(out), tiny_text());
  trainer.train_step();
  const std::string dir = trainer.save();
  fs::remove(dir + "/" + kOptimizerFile);
  EXPECT_NO_THROW(load_checkpoint(out, false));  // enough to generate or evaluate
  EXPECT_NE(error_of([&] { load_checkpoint(out, true); }).find("optimizer.safetensors"), std::string::npos);
  std::ofstream(dir + "/" + kModelFile, std::ios::trunc) << "not safetensors";
  const std::string message = error_of([&] { load_checkpoint(out, false); });
  EXPECT_NE(message.find(dir + "/model.safetensors"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(Checkpoint, OptimizerStateRoundTrip) {
  Tensor w = test::random_tensor({3, 4}, 1), b = test::random_tensor({4}, 2);
  const NamedTensors params = {{"l.weight", w}, {"l.bias", b}};
  AdamW opt = make_adamw(params, AdamWConfig{});
  const NamedTensors grads = {{"l.weight", test::random_tensor({3, 4}, 3)}, {"l.bias", test::random_tensor({4}, 4)}};
  adamw_step(opt, params, grads, 0.1);
  adamw_step(opt, params, grads, 0.1);
  const std::string path = test::temp_dir() + "/opt.safetensors";
  write_safetensors(path, adamw_state_tensors(opt), adamw_state_metadata(opt));
  AdamW other = make_adamw(params, AdamWConfig{});
  load_adamw_state(read_safetensors(path), other);
  EXPECT_EQ(other.step, 2);
  EXPECT_EQ(other.exp_avg[0].to_vector(), opt.exp_avg[0].to_vector());
  EXPECT_EQ(other.exp_avg_sq[1].to_vector(), opt.exp_avg_sq[1].to_vector());
  // A model with different parameters is refused.
  AdamW wrong = make_adamw({{"l.weight", Tensor::zeros({3, 5})}}, AdamWConfig{});
  EXPECT_THROW(load_adamw_state(read_safetensors(path), wrong), Error);
}

// m must be finite and v finite and >= 0: otherwise the first step after a resume writes NaN
// into the weights and the run stops as "diverged (try a lower --lr)" (fuzz_adamw_state).
TEST(Checkpoint, OptimizerStateWithNonFiniteOrNegativeMomentsIsRefused) {
  const NamedTensors params = {{"l.weight", Tensor::zeros({3, 4})}, {"l.bias", Tensor::zeros({4})}};
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    bool second;  // exp_avg_sq, else exp_avg
    float value;
  };
  for (const Case c : {Case{false, nan}, Case{false, -inf}, Case{true, -1e-3f}, Case{true, inf}, Case{true, nan}}) {
    AdamW opt = make_adamw(params, AdamWConfig{});
    opt.step = 2;
    (c.second ? opt.exp_avg_sq : opt.exp_avg)[1].data<float>()[2] = c.value;
    const std::string path = test::temp_dir() + "/bad_opt.safetensors";
    write_safetensors(path, adamw_state_tensors(opt), adamw_state_metadata(opt));
    AdamW other = make_adamw(params, AdamWConfig{});
    const std::string message = error_of([&] { load_adamw_state(read_safetensors(path), other); });
    const std::string tensor = c.second ? "'exp_avg_sq.l.bias'" : "'exp_avg.l.bias'";
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(tensor), std::string::npos) << message;
  }
  // -0 is a square's value: accepted.
  AdamW opt = make_adamw(params, AdamWConfig{});
  opt.exp_avg_sq[0].data<float>()[0] = -0.0f;
  const std::string path = test::temp_dir() + "/zero_opt.safetensors";
  write_safetensors(path, adamw_state_tensors(opt), adamw_state_metadata(opt));
  AdamW other = make_adamw(params, AdamWConfig{});
  EXPECT_NO_THROW(load_adamw_state(read_safetensors(path), other));
}

// A checkpoint's model.safetensors (what eval, generate and a resume load) with a NaN or ±inf
// weight loaded, and every output was NaN with exit 0: refused, naming the file and tensor.
TEST(Checkpoint, ModelWithNonFiniteWeightsIsRefused) {
  CausalLMConfig c;
  c.vocab_size = 256;
  c.max_seq_len = 8;
  c.d_model = 16;
  c.nhead = 2;
  c.num_layers = 1;
  c.dim_feedforward = 32;
  CausalLM model = make_causal_lm(c);
  Rng rng(3);
  init_parameters(model, rng);
  const std::string path = test::temp_dir() + "/nan_model.safetensors";
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, float>>{{"", 0.0f},
                                                  {"encoder.layers.0.linear1.weight", std::nanf("")},
                                                  {"embed.weight", std::numeric_limits<float>::infinity()},
                                                  {"encoder.norm.bias", -std::numeric_limits<float>::infinity()}}) {
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, t] : to_tensor_map(named_parameters(model))) tensors[name] = t.clone();
    if (!key.empty()) tensors[key].data<float>()[5] = value;
    write_safetensors(path, tensors, causal_lm_metadata(c));
    const std::string message = error_of([&] { load_causal_lm(read_safetensors(path)); });
    if (key.empty()) {
      EXPECT_EQ(message, "");
      continue;
    }
    EXPECT_EQ(message, fmt::format("{}: tensor '{}' holds {} at element 5 (a model's weights must be finite)", path,
                                   key, value));
  }
  // The same in a BF16 file (weights may be stored in bf16): the element is reported, as a float.
  for (const float value : {std::nanf(""), -std::numeric_limits<float>::infinity()}) {
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, t] : to_tensor_map(named_parameters(model))) {
      Tensor b = Tensor::empty(t.shape(), DType::BF16);
      for (int64_t j = 0; j < t.numel(); ++j) b.data<bf16>()[j] = float_to_bf16(t.data<float>()[j]);
      tensors[name] = b;
    }
    tensors["encoder.layers.0.linear2.weight"].data<bf16>()[9] = float_to_bf16(value);
    write_safetensors(path, tensors, causal_lm_metadata(c));
    EXPECT_EQ(error_of([&] { load_causal_lm(read_safetensors(path)); }),
              fmt::format("{}: tensor 'encoder.layers.0.linear2.weight' holds {} at element 9 (a model's weights must "
                          "be finite)",
                          path, value));
  }
}

// Adam's moments obey |m| <= 7.27·sqrt(v) (betas 0.9, 0.999) whatever the gradients
// (checkpoint.cpp). A state beyond twice that plus eps, e.g. exp_avg 1e38 with exp_avg_sq 0, was
// accepted although its first update, lr·m̂/(sqrt(v̂) + eps) ≈ 1e46, makes the weights inf.
TEST(Checkpoint, OptimizerStateBeyondAdamsMomentBoundIsRefused) {
  const NamedTensors params = {{"l.weight", Tensor::zeros({3, 4})}, {"l.bias", Tensor::zeros({4})}};
  const auto load_error = [&](float m, float v, const AdamWConfig& config) {
    AdamW opt = make_adamw(params, config);
    opt.step = 2;
    opt.exp_avg[1].data<float>()[2] = m;
    opt.exp_avg_sq[1].data<float>()[2] = v;
    const std::string path = test::temp_dir() + "/unbounded_opt.safetensors";
    write_safetensors(path, adamw_state_tensors(opt), adamw_state_metadata(opt));
    AdamW other = make_adamw(params, config);
    return error_of([&] { load_adamw_state(read_safetensors(path), other); });
  };
  const AdamWConfig defaults;
  for (const auto& [m, v] : std::vector<std::pair<float, float>>{
           {1e38f, 0.0f}, {-1e38f, 0.0f}, {100.0f, 1.0f}, {1e-6f, 0.0f}, {-3e10f, 1e16f}}) {
    const std::string message = load_error(m, v, defaults);
    SCOPED_TRACE(message);
    EXPECT_NE(message.find("unbounded_opt.safetensors: tensor 'exp_avg.l.bias' holds " + fmt::format("{}", m) +
                           " at element 2 where 'exp_avg_sq.l.bias' holds " + fmt::format("{}", v)),
              std::string::npos);
    EXPECT_NE(message.find("14.5"), std::string::npos);  // 2 × 7.27
    EXPECT_NE(message.find("the first update from it would be unbounded"), std::string::npos);
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  // Within the bound: a tiny m whose v underflowed to 0 (eps keeps it legal), and |m| = 14·sqrt(v).
  for (const auto& [m, v] : std::vector<std::pair<float, float>>{
           {1e-30f, 0.0f}, {-1e-30f, 0.0f}, {1.4e-7f, 0.0f}, {14.0f, 1.0f}, {-1.4e19f, 1e36f}, {0.0f, 0.0f}})
    EXPECT_EQ(load_error(m, v, defaults), "") << m << " " << v;
  // Other betas, other constants: (1 − β1)/sqrt((1 − β2)(1 − β1²/β2)) is 1.86 for (0.5, 0.9)...
  EXPECT_NE(load_error(3.8f, 1.0f, {0.5, 0.9, 1e-8, 0.0}), "");
  EXPECT_EQ(load_error(3.6f, 1.0f, {0.5, 0.9, 1e-8, 0.0}), "");
  // ...and there is none when β1² >= β2 (the series diverges): only finiteness is checked.
  EXPECT_EQ(load_error(1e38f, 0.0f, {0.99, 0.9, 1e-8, 0.0}), "");
}

// The betas that made a state bound it, and a resumed run may be given others: the looser bound
// of the two applies. (0.5, 0.9999) allows |m| up to 2 × 57.7·sqrt(v); (0.5, 0.9) only 2 × 1.86.
TEST(Checkpoint, OptimizerStateBoundUsesTheFilesBetasAndTheRuns) {
  const NamedTensors params = {{"l.weight", Tensor::zeros({3, 4})}, {"l.bias", Tensor::zeros({4})}};
  const auto load_error = [&](float m, const AdamWConfig& saved_with, const AdamWConfig& loaded_with,
                              const std::map<std::string, std::string>& metadata_changes = {}) {
    AdamW opt = make_adamw(params, saved_with);
    opt.step = 2;
    opt.exp_avg[0].data<float>()[7] = m;
    opt.exp_avg_sq[0].data<float>()[7] = 1.0f;
    auto metadata = adamw_state_metadata(opt);
    for (const auto& [key, value] : metadata_changes) {
      if (value.empty())
        metadata.erase(key);
      else
        metadata[key] = value;
    }
    const std::string path = test::temp_dir() + "/betas_opt.safetensors";
    write_safetensors(path, adamw_state_tensors(opt), metadata);
    AdamW other = make_adamw(params, loaded_with);
    return error_of([&] { load_adamw_state(read_safetensors(path), other); });
  };
  const AdamWConfig defaults, wide{0.5, 0.9999, 1e-8, 0.0}, narrow{0.5, 0.9, 1e-8, 0.0};
  // Made with (0.5, 0.9999), resumed with the defaults (bound 14.5): the file's 115 applies.
  EXPECT_EQ(load_error(100.0f, wide, defaults), "");
  const std::string beyond = load_error(120.0f, wide, defaults);
  EXPECT_NE(beyond.find("betas_opt.safetensors: tensor 'exp_avg.l.weight' holds 120 at element 7"), std::string::npos)
      << beyond;
  EXPECT_NE(beyond.find("115"), std::string::npos) << beyond;
  EXPECT_NE(beyond.find("for betas (0.5, 0.9999)"), std::string::npos) << beyond;
  // Made with the defaults, resumed with (0.5, 0.9) (bound 3.72): the file's 14.5 applies.
  EXPECT_EQ(load_error(10.0f, defaults, narrow), "");
  EXPECT_NE(load_error(15.0f, defaults, narrow).find("14.5"), std::string::npos);
  // Made and resumed with (0.5, 0.9): 3.72.
  EXPECT_NE(load_error(10.0f, narrow, narrow), "");
  // No bound for the file's betas (β1² >= β2): only finiteness.
  EXPECT_EQ(load_error(1e30f, {0.99, 0.9, 1e-8, 0.0}, defaults), "");
  // A state without betas in its metadata: the run's bound alone.
  EXPECT_EQ(load_error(10.0f, wide, defaults, {{"beta1", ""}}), "");
  EXPECT_NE(load_error(100.0f, wide, defaults, {{"beta1", ""}}).find("14.5"), std::string::npos);
  // Betas that are not numbers in [0, 1): an error naming the file and the key.
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"beta1", "nan"}, {"beta1", "1"}, {"beta2", "-0.5"}, {"beta2", "0.9x"}, {"beta1", "1e999"}}) {
    const std::string message = load_error(1.0f, defaults, defaults, {{key, value}});
    EXPECT_NE(message.find("betas_opt.safetensors: metadata '" + key + "'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

// States that AdamW itself produced load, for gradients of any scale: random, huge (1e18: g² is
// still finite in fp32), tiny (1e-30: v underflows to 0 while m does not), and the sequence that
// makes Cauchy–Schwarz tight, g_t ∝ (β2/β1)^t, for which |m|/sqrt(v) approaches 7.27.
TEST(Checkpoint, OptimizerStatesOfRealStepsAreAccepted) {
  const AdamWConfig defaults;
  const auto check = [&](const std::string& what, int steps, const std::function<float(int, int64_t)>& gradient,
                         const AdamWConfig& config = {}) {
    SCOPED_TRACE(what);
    const NamedTensors params = {{"l.weight", test::random_tensor({8, 16}, 1)}, {"l.bias", Tensor::zeros({16})}};
    const NamedTensors grads = {{"l.weight", Tensor::zeros({8, 16})}, {"l.bias", Tensor::zeros({16})}};
    AdamW opt = make_adamw(params, config);
    for (int t = 0; t < steps; ++t) {
      for (const auto& [name, g] : grads)
        for (int64_t j = 0; j < g.numel(); ++j) g.data<float>()[j] = gradient(t, j);
      adamw_step(opt, params, grads, 1e-3);
    }
    const std::string path = test::temp_dir() + "/real_opt.safetensors";
    write_safetensors(path, adamw_state_tensors(opt), adamw_state_metadata(opt));
    AdamW other = make_adamw(params, config);
    EXPECT_EQ(error_of([&] { load_adamw_state(read_safetensors(path), other); }), "");
    double ratio = 0;  // the largest |m|/sqrt(v) reached
    for (size_t i = 0; i < opt.names.size(); ++i)
      for (int64_t j = 0; j < opt.exp_avg[i].numel(); ++j)
        if (opt.exp_avg_sq[i].data<float>()[j] > 0)
          ratio = std::max(ratio, std::abs(opt.exp_avg[i].data<float>()[j]) /
                                      std::sqrt(static_cast<double>(opt.exp_avg_sq[i].data<float>()[j])));
    return ratio;
  };
  Rng rng(5);
  const auto uniform = [&rng](float scale) {
    return [&rng, scale](int, int64_t) { return scale * (2 * rng.next_uniform() - 1); };
  };
  check("random", 20, uniform(1.0f));
  check("huge", 20, uniform(1e18f));
  check("tiny", 20, uniform(1e-30f));
  check("huge then tiny", 30, [&](int t, int64_t j) { return t < 5 ? 1e18f : (j % 2 ? 1e-30f : -1e-30f); });
  check("tiny then huge", 30, [&](int t, int64_t) { return t < 25 ? 1e-30f : 1e18f; });
  check("mixed scales", 20, [&](int t, int64_t j) { return std::pow(10.0f, static_cast<float>((j + t) % 37 - 18)); });
  const double tight = check("worst case", 400, [&](int t, int64_t) {
    return static_cast<float>(std::pow(defaults.beta2 / defaults.beta1, t - 400));
  });
  EXPECT_GT(tight, 7.0);   // the bound is nearly reached...
  EXPECT_LT(tight, 7.28);  // ...and holds (7.27)
  const double tight_05 =
      check("worst case, betas (0.5, 0.9)", 60,
            [&](int t, int64_t) { return static_cast<float>(std::pow(0.9 / 0.5, t - 60)); }, {0.5, 0.9, 1e-8, 0.0});
  EXPECT_GT(tight_05, 1.8);
  EXPECT_LT(tight_05, 1.87);  // 1.86
}

// Steps go up to kMaxSteps (2^40, 13 digits); step-%08d names have more than 8 digits from step
// 10^8 on. Such a checkpoint must resolve, and the keep policy must order steps by number, not
// by name ("step-100000000" < "step-99999999" as strings) (fuzz_checkpoint_dir).
TEST(Checkpoint, StepsBeyondEightDigitsResolveAndTheNewestAreKept) {
  const std::string out = fresh_dir("many_steps");
  const NamedTensors params = {{"w", Tensor::zeros({2})}};
  for (const int64_t step : {int64_t{99999999}, int64_t{100000000}, int64_t{100000001}}) {
    CheckpointWrite w;
    w.step = step;
    w.params = &params;
    w.state = {{"step", step}};
    save_checkpoint(out, w, 2);
  }
  EXPECT_EQ(resolve_checkpoint(out), out + "/step-100000001");
  EXPECT_EQ(checkpoint_step(load_checkpoint(out, false)), 100000001);
  EXPECT_FALSE(fs::exists(out + "/step-99999999"));
  EXPECT_TRUE(fs::exists(out + "/step-100000000"));

  CheckpointWrite last;
  last.step = kMaxSteps;
  last.params = &params;
  last.state = {{"step", kMaxSteps}};
  save_checkpoint(out, last, 1);
  EXPECT_EQ(checkpoint_step(load_checkpoint(out, false)), kMaxSteps);
  EXPECT_FALSE(fs::exists(out + "/step-100000001"));
  // Names that no save writes stay refused: too few digits, not canonical, past kMaxSteps.
  for (const char* name : {"step-0000001", "step-000000001", "step-01099511627776", "step-1099511627777"}) {
    std::ofstream(out + "/latest", std::ios::trunc) << name << "\n";
    EXPECT_NE(error_of([&] { resolve_checkpoint(out); }).find("malformed"), std::string::npos) << name;
  }
}

// An entry of the run directory that cannot be examined (here a symbolic link loop named like a
// checkpoint) is left alone by the keep policy; it made save_checkpoint throw
// std::filesystem::filesystem_error after the checkpoint was written (fuzz_checkpoint_dir).
TEST(Checkpoint, EntriesThatCannotBeExaminedDoNotFailTheSave) {
  const std::string out = fresh_dir("loop");
  fs::create_directories(out);
  fs::create_directory_symlink("step-00000001", out + "/step-00000001");  // points at itself
  const NamedTensors params = {{"w", Tensor::zeros({2})}};
  for (const int64_t step : {2, 3}) {
    CheckpointWrite w;
    w.step = step;
    w.params = &params;
    w.state = {{"step", step}};
    EXPECT_NO_THROW(save_checkpoint(out, w, 1)) << step;
  }
  EXPECT_EQ(resolve_checkpoint(out), out + "/step-00000003");
  EXPECT_FALSE(fs::exists(out + "/step-00000002"));
  EXPECT_TRUE(fs::is_symlink(out + "/step-00000001"));
}

}  // namespace
}  // namespace cabm
