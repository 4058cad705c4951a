// `cabm bench layer` and `cabm bench train`: whole-model timings, fp32 against bf16 mixed
// precision (cabm/nn/mixed_precision.h) side by side, with the ratio measured in the same process.
//
//   layer  one encoder layer (pre-norm, GELU): forward (eval) and forward + backward (training)
//   train  one optimizer step of the LM trainer (forward, loss, backward, clip, AdamW, bf16
//          weight refresh): the default `cabm train` model and a configurable one
//
// fp32 and bf16 calls alternate (one of each per repeat) and the medians are compared, so load
// from other jobs on a shared machine hits both about equally. On CPUs without AVX-512 BF16
// (bf16 path "portable"), gemm_bf16 converts its operands back to fp32 and calls sgemm, and the
// bf16 attention kernel runs scalar code: expect bf16 to be SLOWER there; the bench says which
// path ran.
#include "cabm/core/error.h"
#include "cabm/core/memory.h"
#include "cabm/core/rng.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm.h"
#include "cabm/kernels/gemm_route.h"
#include "cabm/kernels/machine_wisdom.h"
#include "cabm/nn/encoder_layer.h"
#include "cabm/nn/init.h"
#include "cabm/nn/mixed_precision.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/lm_trainer.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cabm::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct Paired {
  double fp32 = 0, bf16 = 0;  // median seconds
};

// One warm-up call of each, then `repeats` alternating timed calls of each; medians.
Paired time_paired(int64_t repeats, const std::function<void()>& fp32, const std::function<void()>& bf16) {
  fp32();
  bf16();
  std::vector<double> a, b;
  for (int64_t r = 0; r < repeats; ++r) {
    for (int which = 0; which < 2; ++which) {
      const auto t0 = Clock::now();
      (which == 0 ? fp32 : bf16)();
      (which == 0 ? a : b).push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  return {median(a), median(b)};
}

void print_paths() {
  std::printf("bf16 paths: conversions %s, attention forward %s, backward %s\n", bf16_conversion_path_name(),
              attention_flash_bf16_path(), attention_flash_bf16_backward_path());
  std::printf("bf16 products: %s\n", bf16_products_summary().c_str());
}

void print_row(const char* what, const Paired& t, double tokens) {
  std::printf("%-18s %10.2f %10.2f %9.2fx %14s %14s\n", what, t.fp32 * 1e3, t.bf16 * 1e3, t.fp32 / t.bf16,
              format_count(tokens / t.fp32).c_str(), format_count(tokens / t.bf16).c_str());
}

void print_table_header() {
  std::printf("%-18s %10s %10s %10s %14s %14s\n", "", "fp32 ms", "bf16 ms", "bf16 speed", "fp32 tokens/s",
              "bf16 tokens/s");
}

void set_threads(CLI::Option* option, int threads) {
  apply_threads(option, threads);
}

constexpr int64_t kMaxRepeats = 1 << 20;

// ---------------------------------------------------------------------------------------------
struct LayerFlags {
  int64_t batch = 8, seq_len = 256, d_model = 256, heads = 4, d_ff = 1024, repeats = 5;
  std::string mask = "causal";
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

double relative_difference(const Tensor& a, const Tensor& b) {
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    den += static_cast<double>(y[i]) * y[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void bench_layer(const LayerFlags& f) {
  set_threads(f.threads_option, f.threads);
  if (f.d_model % f.heads != 0)
    throw UsageError(fmt::format("--d-model ({}) must be divisible by --heads ({})", f.d_model, f.heads));
  // Two layers of parameters and gradients each; per precision a cache of at least 8E + 2F
  // floats per token, and x, dy, dx.
  const double tokens = static_cast<double>(f.batch) * static_cast<double>(f.seq_len);
  const double E = static_cast<double>(f.d_model), F = static_cast<double>(f.d_ff);
  check_fits_in_memory(4 * 4 * (4 * E * E + 2 * E * F) + 2 * tokens * 4 * (8 * E + 2 * F) + 3 * tokens * E * 4,
                       fmt::format("bench layer --batch {} --seq-len {} --d-model {} --d-ff {}", f.batch, f.seq_len,
                                   f.d_model, f.d_ff));
  Mask mask;
  if (f.mask == "causal")
    mask = Mask::causal();
  else if (f.mask != "none")
    throw Error(fmt::format("--mask: unknown mask '{}' (expected none or causal)", f.mask));
  EncoderLayerConfig config{f.d_model, f.heads, f.d_ff, 0.0f, Activation::kGelu, 1e-5f, /*norm_first=*/true};
  EncoderLayer fp32 = make_encoder_layer(config);  // validates the sizes
  Rng rng(1);
  init_parameters(fp32, rng);
  EncoderLayer bf16 = make_encoder_layer(config);
  const NamedTensors src = named_parameters(fp32);
  NamedTensors dst = named_parameters(bf16);
  for (size_t i = 0; i < src.size(); ++i) dst[i].tensor.copy_from(src[i].tensor);
  set_precision(bf16, Precision::kBf16);
  EncoderLayer grads_fp32 = make_encoder_layer(config), grads_bf16 = make_encoder_layer(config);

  const Shape shape{f.batch, f.seq_len, f.d_model};
  Tensor x = Tensor::empty(shape), dy = Tensor::empty(shape), dx = Tensor::empty(shape);
  Rng data(2);
  for (Tensor* t : {&x, &dy}) {
    float* p = t->data<float>();
    for (int64_t i = 0; i < t->numel(); ++i) p[i] = 2.0f * data.next_uniform() - 1.0f;
  }
  EncoderLayerCache cache_fp32, cache_bf16;
  ForwardMode train;
  train.training = true;

  std::printf("cabm bench layer: B %lld, N %lld, E %lld, H %lld, F %lld, mask %s, pre-norm GELU, %d threads\n",
              static_cast<long long>(f.batch), static_cast<long long>(f.seq_len), static_cast<long long>(f.d_model),
              static_cast<long long>(f.heads), static_cast<long long>(f.d_ff), f.mask.c_str(), num_threads());
  print_paths();
  const Paired forward = time_paired(
      f.repeats, [&] { encoder_layer_forward(fp32, x, mask, cache_fp32); },
      [&] { encoder_layer_forward(bf16, x, mask, cache_bf16); });
  const double diff = relative_difference(cache_bf16.output, cache_fp32.output);
  const Paired both = time_paired(
      f.repeats,
      [&] {
        encoder_layer_forward(fp32, x, mask, cache_fp32, train);
        encoder_layer_backward(fp32, x, dy, dx, cache_fp32, grads_fp32);
      },
      [&] {
        encoder_layer_forward(bf16, x, mask, cache_bf16, train);
        encoder_layer_backward(bf16, x, dy, dx, cache_bf16, grads_bf16);
      });
  print_table_header();
  print_row("forward", forward, tokens);
  print_row("forward+backward", both, tokens);
  std::printf("output ||bf16 - fp32|| / ||fp32|| = %.2e (bf16 unit roundoff 2^-8 = %.2e)\n", diff, std::ldexp(1.0, -8));
  std::printf("%s\n", gemm_route_summary().c_str());
  std::printf("%s\n", machine_values_summary().c_str());
  if (!cpu_isa_cap_line().empty()) std::printf("%s\n", cpu_isa_cap_line().c_str());
  std::printf("gemm_bf16 ran on: %s\n", gemm_bf16_implementations_used().c_str());
  std::printf("(bf16 speed = fp32 time / bf16 time, medians of %lld alternating calls each)\n",
              static_cast<long long>(f.repeats));
}

// ---------------------------------------------------------------------------------------------
struct TrainBenchFlags {
  int64_t layers = 4, d_model = 256, heads = 4, d_ff = 1024, seq_len = 256, batch_size = 8, steps = 6;
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

// Random printable text: the trainers only need bytes to sample windows from.
TextSplit synthetic_text(int64_t bytes) {
  TextSplit split;
  split.source = "synthetic";
  Rng rng(7);
  for (std::string* s : {&split.train, &split.validation}) {
    s->resize(static_cast<size_t>(bytes));
    for (char& c : *s) c = static_cast<char>(32 + rng.next_u32() % 95);
  }
  split.train_documents = split.validation_documents = 1;
  return split;
}

void bench_train_config(const char* name, TrainConfig c, int64_t steps) {
  c.steps = 1000000;  // the schedule's length: irrelevant to the timing
  TrainConfig b = c;
  c.precision = Precision::kFp32;
  b.precision = Precision::kBf16;
  const TextSplit text = synthetic_text(std::max<int64_t>(1 << 16, 4 * (c.seq_len + 1)));
  LmTrainer fp32(c, text), bf16(b, text);
  const double tokens = static_cast<double>(c.batch_size * c.seq_len * c.accum);
  std::printf("%s: %lld layers, d_model %lld, %lld heads, d_ff %lld, batch %lld x %lld: %s parameters\n", name,
              static_cast<long long>(c.layers), static_cast<long long>(c.d_model), static_cast<long long>(c.heads),
              static_cast<long long>(c.d_ff), static_cast<long long>(c.batch_size), static_cast<long long>(c.seq_len),
              format_count(static_cast<double>(parameter_count(fp32.parameters()))).c_str());
  double loss_fp32 = 0, loss_bf16 = 0;
  const Paired t = time_paired(
      steps, [&] { loss_fp32 = fp32.train_step().loss; }, [&] { loss_bf16 = bf16.train_step().loss; });
  print_table_header();
  print_row("training step", t, tokens);
  std::printf("loss after %lld steps (same init and batches): fp32 %.4f, bf16 %.4f\n",
              static_cast<long long>(fp32.step()), loss_fp32, loss_bf16);
}

void bench_train(const TrainBenchFlags& f) {
  set_threads(f.threads_option, f.threads);
  std::printf("cabm bench train: one optimizer step, fp32 vs bf16 mixed precision, %d threads\n", num_threads());
  print_paths();
  bench_train_config("default LM (cabm train)", default_train_config(TrainTask::kLanguageModel), f.steps);
  TrainConfig c = default_train_config(TrainTask::kLanguageModel);
  c.layers = f.layers;
  c.d_model = f.d_model;
  c.heads = f.heads;
  c.d_ff = f.d_ff;
  c.seq_len = f.seq_len;
  c.batch_size = f.batch_size;
  bench_train_config("configured LM", c, f.steps);
  std::printf("(bf16 speed = fp32 time / bf16 time, medians of %lld alternating steps each)\n",
              static_cast<long long>(f.steps));
  std::printf("%s\n", gemm_route_summary().c_str());
  std::printf("%s\n", machine_values_summary().c_str());
  if (!cpu_isa_cap_line().empty()) std::printf("%s\n", cpu_isa_cap_line().c_str());
  std::printf("gemm_bf16 ran on: %s\n", gemm_bf16_implementations_used().c_str());
}

}  // namespace

void register_bench_model(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");  // made by register_bench (cmd_bench.cpp)

  CLI::App* layer = bench->add_subcommand(
      "layer", "Time one encoder layer, forward and forward+backward, fp32 vs bf16 mixed precision");
  auto lf = std::make_shared<LayerFlags>();
  // The ranges of `cabm train`'s flags of the same meaning (cabm/train/train_config.h).
  const auto range = [](const char* flag) { return integer_in(int_setting(flag).min, int_setting(flag).max); };
  layer->add_option("--batch", lf->batch, "batch B (default 8)")->check(range("--batch-size"));
  layer->add_option("--seq-len", lf->seq_len, "sequence length N (default 256)")->check(range("--seq-len"));
  layer->add_option("--d-model", lf->d_model, "model width E (default 256)")->check(range("--d-model"));
  layer->add_option("--heads", lf->heads, "heads H (default 4)")->check(range("--heads"));
  layer->add_option("--d-ff", lf->d_ff, "feed-forward width F (default 1024)")->check(range("--d-ff"));
  layer->add_option("--mask", lf->mask, "causal (default) or none")
      ->check(accepted_by(
          [](const std::string& m) {
            if (m != "causal" && m != "none")
              throw Error(fmt::format("unknown mask '{}' (expected none or causal)", m));
          },
          "causal or none"));
  layer->add_option("--repeats", lf->repeats, "timed calls of each precision, the median is reported (default 5)")
      ->check(integer_in(1, kMaxRepeats));
  lf->threads_option = add_threads_option(layer, lf->threads);
  layer->callback([lf] { bench_layer(*lf); });

  CLI::App* train = bench->add_subcommand(
      "train", "Time one training step (tokens/s) of the default LM and of a configured one, fp32 vs bf16");
  auto tf = std::make_shared<TrainBenchFlags>();
  train->add_option("--layers", tf->layers, "configured LM: layers (default 4)")->check(range("--layers"));
  train->add_option("--d-model", tf->d_model, "configured LM: width E (default 256)")->check(range("--d-model"));
  train->add_option("--heads", tf->heads, "configured LM: heads (default 4)")->check(range("--heads"));
  train->add_option("--d-ff", tf->d_ff, "configured LM: feed-forward width (default 1024)")->check(range("--d-ff"));
  train->add_option("--seq-len", tf->seq_len, "configured LM: context (default 256)")->check(range("--seq-len"));
  train->add_option("--batch-size", tf->batch_size, "configured LM: sequences per step (default 8)")
      ->check(range("--batch-size"));
  train->add_option("--steps", tf->steps, "timed steps of each precision, the median is reported (default 6)")
      ->check(integer_in(1, kMaxRepeats));
  tf->threads_option = add_threads_option(train, tf->threads);
  train->callback([tf] { bench_train(*tf); });
}

}  // namespace cabm::cli
