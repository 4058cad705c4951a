// `cabm memory`: where a causal LM's training memory goes, estimated from the shapes of what the
// code allocates (parameters, gradients, AdamW state, the activations each layer's cache keeps
// for backward, attention's N×N matrices or their O(N) replacement), then one real training step
// (forward + loss + backward) measured as the increase of the process's peak RSS. docs/memory.md
// explains the numbers.
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cabm/core/error.h"
#include "cabm/core/memory.h"
#include "cabm/core/rng.h"
#include "cabm/core/tensor.h"
#include "cabm/core/threads.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/init.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/lm_trainer.h"
#include "cabm/train/model_config.h"
#include "cabm/train/train_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cabm::cli {

namespace {

struct MemoryFlags {
  TrainConfig train;  // the `cabm train` defaults for the LM: L 4, E 128, H 4, F 512, T 128, B 16
  int64_t vocab = 256;
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

constexpr double kF32 = 4;
constexpr int64_t kMaxVocab = 1 << 24;

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

// Byte counts are doubles: the estimate is printed before anything is checked against memory,
// and B·H·N·N·L for large flags is beyond int64.
struct Item {
  std::string name, shape;
  double bytes;
};

double print_items(const char* title, const std::vector<Item>& items, int64_t multiplier = 1) {
  double total = 0;
  for (const Item& i : items) total += i.bytes;
  std::printf("%s: %s%s\n", title, human(total * static_cast<double>(multiplier)).c_str(),
              multiplier > 1 ? fmt::format(" ({} x {})", multiplier, human(total)).c_str() : "");
  for (const Item& i : items)
    std::printf("    %-32s %-18s %12s\n", i.name.c_str(), i.shape.c_str(), human(i.bytes).c_str());
  return total * static_cast<double>(multiplier);
}

void run_memory(const MemoryFlags& f) {
  apply_threads(f.threads_option, f.threads);
  validate(f.train);
  CausalLMConfig mc = lm_model_config(f.train);
  mc.vocab_size = f.vocab;
  const int64_t L = mc.num_layers, E = mc.d_model, H = mc.nhead, F = mc.dim_feedforward, V = mc.vocab_size;
  const int64_t W = E + 2 * (E / H) * mc.num_kv_heads;  // q, k, v columns (3E without grouped-query attention)
  const int64_t B = f.train.batch_size, N = f.train.seq_len;
  const double BN = static_cast<double>(B) * static_cast<double>(N);

  std::printf("causal LM: L %lld, E %lld, H %lld (d %lld, %lld key/value heads), F %lld, V %lld, T %lld, B %lld, %s, "
              "fp32\n",
              static_cast<long long>(L), static_cast<long long>(E), static_cast<long long>(H),
              static_cast<long long>(E / H), static_cast<long long>(mc.num_kv_heads), static_cast<long long>(F), static_cast<long long>(V),
              static_cast<long long>(N), static_cast<long long>(B), mc.norm_first ? "pre-norm" : "post-norm");
  std::printf("\nESTIMATE (from the shapes the code allocates)\n");

  // The measured step below allocates the model, its gradients and the step's activations:
  // refuse it before anything is allocated when that cannot fit (lower bounds: per token and
  // layer 8E + 2F saved floats, the logits and their gradient).
  check_fits_in_memory(2 * cabm::parameter_count(mc) * kF32 +
                           BN * kF32 * (static_cast<double>(L) * (8.0 * E + 2.0 * F) + 2.0 * V),
                       fmt::format("the measured step of --layers {} --d-model {} --d-ff {} --vocab {} --seq-len {} "
                                   "--batch-size {}",
                                   L, E, F, V, N, B));

  // Parameters: counted from the model itself, so the names and shapes are the real ones.
  const int64_t base_rss = current_rss_bytes();
  MemoryProbe probe;
  probe.start();
  CausalLM model = make_causal_lm(mc);
  CausalLM grads = make_causal_lm(mc);
  const NamedTensors params = named_parameters(model);
  const int64_t P = parameter_count(params);
  const double param_bytes = static_cast<double>(P) * kF32;
  std::printf("parameters: %lld = %s\n", static_cast<long long>(P), human(static_cast<double>(param_bytes)).c_str());
  std::printf("gradients: %s (one fp32 per parameter)\n", human(static_cast<double>(param_bytes)).c_str());
  std::printf("AdamW state: %s (m and v: 2 x parameters; allocated by the optimizer, not in the step below)\n",
              human(static_cast<double>(2 * param_bytes)).c_str());

  const std::string bne = fmt::format("[{},{},{}]", B, N, E);
  std::vector<Item> layer = {
      {"attn.qkv (q, k, v views)", fmt::format("[{},{},{}]", B, N, W), BN * W * kF32},
      {"attn.attn (heads merged)", bne, BN * E * kF32},
      {"attn.lse", fmt::format("[{},{},{}]", B, H, N), B * H * N * kF32},
      {"attn.output", bne, BN * E * kF32},
      {"ffn.pre_activation", fmt::format("[{},{}]", BN, F), BN * F * kF32},
      {"ffn.hidden", fmt::format("[{},{}]", BN, F), BN * F * kF32},
      {"norm1/norm2 mean, rstd", fmt::format("4 x [{}]", BN), 4 * BN * kF32},
      {"norm1_out", bne, BN * E * kF32},
      {"mid (residual stream)", bne, BN * E * kF32},
      {mc.norm_first ? "norm2_out" : "sum2", bne, BN * E * kF32},
      {"ffn_out", bne, BN * E * kF32},
      {"output", bne, BN * E * kF32},
  };
  const double activations = print_items("saved activations per layer (x L)", layer, L);
  std::vector<Item> model_level = {
      {"tokens (I64)", fmt::format("[{},{}]", B, N), BN * 8},
      {"embedded", bne, BN * E * kF32},
      {"final norm mean, rstd + output", bne, BN * E * kF32 + 2 * BN * kF32},
      {"logits", fmt::format("[{},{},{}]", B, N, V), BN * V * kF32},
      {"dlogits", fmt::format("[{},{},{}]", B, N, V), BN * V * kF32},
      {"loss lse", fmt::format("[{}]", BN), BN * kF32},
  };
  const double model_activations = print_items("model-level activations", model_level);
  std::vector<Item> scratch = {
      {"d_a, d_b (encoder)", fmt::format("2 x {}", bne), 2 * BN * E * kF32},
      {"attn.d_attn", bne, BN * E * kF32},
      {"attn.d_qkv", fmt::format("[{},{},{}]", B, N, W), BN * W * kF32},
      {"ffn.d_hidden", fmt::format("[{},{}]", BN, F), BN * F * kF32},
      {"d_hidden (model)", bne, BN * E * kF32},
  };
  const double scratch_bytes = print_items("backward scratch (one set, moved from layer to layer)", scratch);

  const double scores = static_cast<double>(B * H) * static_cast<double>(N) * static_cast<double>(N) * kF32;
  const double lse = static_cast<double>(B * H * N) * kF32;
  std::printf("attention scores/weights per layer:\n");
  std::printf(
      "    reference path (N x N weights A per head, kept for backward as PyTorch does): B*H*N*N*4 = %s per layer, "
      "%s for L layers (the scores S are another N x N buffer while the forward runs)\n",
      human(static_cast<double>(scores)).c_str(), human(static_cast<double>(scores * L)).c_str());
  std::printf("    tiled (flash) path, used here: only lse B*H*N*4 = %s per layer (counted above)\n",
              human(static_cast<double>(lse)).c_str());
  const double step_estimate = 2 * param_bytes + activations + model_activations + scratch_bytes;
  std::printf("estimated step total (params + grads + activations + scratch): %s\n",
              human(static_cast<double>(step_estimate)).c_str());
  std::printf("  with the reference path's N x N weights saved: %s; with AdamW state: %s\n",
              human(static_cast<double>(step_estimate + scores * L)).c_str(),
              human(static_cast<double>(step_estimate + 2 * param_bytes)).c_str());

  // One real step on random tokens: parameters initialised, gradients zeroed (make_causal_lm
  // sets LayerNorm weights to 1, so a gradient model must be zeroed), forward in training mode,
  // loss, backward.
  Rng rng(f.train.seed);
  init_parameters(model, rng);
  zero_parameters(named_parameters(grads));
  const int64_t after_params = probe.peak_increase();
  Tensor tokens = Tensor::empty({B, N}, DType::I64), targets = Tensor::empty({B, N}, DType::I64);
  int64_t* tok = tokens.data<int64_t>();
  int64_t* tgt = targets.data<int64_t>();
  for (int64_t n = 0; n < B * N; ++n) tok[n] = static_cast<int64_t>(rng.next_u32() % static_cast<uint32_t>(V));
  for (int64_t n = 0; n < B * N; ++n) tgt[n] = static_cast<int64_t>(rng.next_u32() % static_cast<uint32_t>(V));
  const auto t0 = std::chrono::steady_clock::now();
  CausalLMCache cache;
  ForwardMode mode;
  mode.training = true;
  mode.seed = f.train.seed;
  causal_lm_forward(model, tokens, cache, mode);
  const CrossEntropyResult loss = causal_lm_loss(targets, LossOptions{}, cache);
  causal_lm_backward(model, cache, grads);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t total = probe.peak_increase();

  std::printf("\nMEASURED (one forward + loss + backward on random tokens, loss %.4f, %.3f s)\n", loss.loss, seconds);
  std::printf("peak RSS increase: params + grads %s (estimate %s); whole step %s (estimate %s)%s\n",
              human(static_cast<double>(after_params)).c_str(), human(static_cast<double>(2 * param_bytes)).c_str(),
              human(static_cast<double>(total)).c_str(), human(static_cast<double>(step_estimate)).c_str(),
              probe.reset_worked() ? "" : " [peak reset unavailable: process peak since start]");
  std::printf("process RSS before %s, peak %s\n", human(static_cast<double>(base_rss)).c_str(),
              human(static_cast<double>(peak_rss_bytes())).c_str());
}

}  // namespace

void register_memory(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "memory", "Where a causal LM's training memory goes: estimate by tensor, then one measured training step");
  auto f = std::make_shared<MemoryFlags>();
  // The ranges of `cabm train`'s flags of the same names (cabm/train/train_config.h).
  const auto add_int = [&](const char* flag, int64_t& value, const char* help) {
    const IntSetting& s = int_setting(flag);
    cmd->add_option(flag, value, help)->check(integer_in(s.min, s.max));
  };
  add_int("--layers", f->train.layers, "encoder layers L (default 4)");
  add_int("--d-model", f->train.d_model, "model width E (default 128)");
  add_int("--heads", f->train.heads, "attention heads H (default 4)");
  add_int("--kv-heads", f->train.kv_heads, "key/value heads (grouped-query attention; default: H)");
  add_int("--d-ff", f->train.d_ff, "feed-forward width F (default 512)");
  cmd->add_option("--vocab", f->vocab, "vocabulary size V (default 256, bytes)")->check(integer_in(1, kMaxVocab));
  add_int("--seq-len", f->train.seq_len, "sequence length T = N (default 128)");
  add_int("--batch-size", f->train.batch_size, "sequences per batch B (default 16)");
  f->threads_option = add_threads_option(cmd, f->threads);
  cmd->callback([f] { run_memory(*f); });
}

}  // namespace cabm::cli
