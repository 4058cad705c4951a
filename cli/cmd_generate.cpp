// `cabm generate`: sample text from a trained causal LM checkpoint, streamed as it is
// generated (one incremental KV-cache step per byte).
#include "cli/commands.h"
#include "cli/progress.h"
#include "cabm/core/error.h"
#include "cabm/core/threads.h"
#include "cabm/interop/state_dict.h"
#include "cabm/io/tokenizer.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/mixed_precision.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/generate.h"
#include "cabm/train/model_config.h"

#include <cstdio>
#include <memory>

namespace cabm::cli {

namespace {

struct GenerateFlags {
  std::string checkpoint, prompt, precision = "fp32";
  int64_t tokens = 500;
  float temperature = 0.8f;
  int64_t top_k = 0;
  uint64_t seed = 1;
  int threads = 0;
  CLI::Option* prompt_option = nullptr;
  CLI::Option* threads_option = nullptr;
};

}  // namespace

void register_generate(CLI::App& app) {
  CLI::App* cmd =
      app.add_subcommand("generate", "Sample text from a trained causal LM checkpoint (streamed, KV cache)");
  auto f = std::make_shared<GenerateFlags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint directory, or a run directory (its latest checkpoint)")
      ->required();
  f->prompt_option =
      cmd->add_option("--prompt", f->prompt, "text to continue (default: the start of a new fortune / line)");
  cmd->add_option("--tokens", f->tokens, "bytes to generate (default 500)");
  cmd->add_option("--temperature", f->temperature, "sampling temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", f->top_k, "sample among the k most likely bytes only; 0 = all (default 0)");
  cmd->add_option("--seed", f->seed, "sampling seed (default 1)");
  f->threads_option = cmd->add_option("--threads", f->threads, "threads (default: CABM_NUM_THREADS or all cores)");
  cmd->add_option("--precision", f->precision,
                  "fp32 (default) or bf16: bf16 weight copies and matrix products, bf16 KV cache (half the memory)");

  cmd->callback([f] {
    if (f->threads_option->count() > 0) {
      if (f->threads < 1) throw Error(fmt::format("--threads must be at least 1, got {}", f->threads));
      set_num_threads(f->threads);
    }
    if (f->tokens < 0) throw Error(fmt::format("--tokens must be >= 0, got {}", f->tokens));
    if (!(f->temperature >= 0.0f)) throw Error(fmt::format("--temperature must be >= 0, got {}", f->temperature));
    if (f->top_k < 0) throw Error(fmt::format("--top-k must be >= 0, got {}", f->top_k));
    const Precision precision = parse_precision(f->precision);
    const LoadedCheckpoint checkpoint = load_checkpoint(f->checkpoint, false);
    CausalLM model = load_causal_lm(checkpoint.model);
    set_precision(model, precision);

    std::string prompt;
    const bool user_prompt = f->prompt_option->count() > 0 && !f->prompt.empty();
    if (user_prompt) {
      if (const auto bad = find_invalid_utf8(f->prompt))
        throw Error(fmt::format("--prompt is not valid UTF-8 (byte offset {})", *bad));
      prompt = f->prompt;
    } else {
      // Trained on fortunes (entries end with "\n%\n"): start a new entry; otherwise a new line.
      const auto config = checkpoint.state.value("config", nlohmann::json::object());
      prompt = config.value("data", std::string()).empty() ? "%\n" : "\n";
    }
    if (user_prompt) {
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fflush(stdout);
    }
    SamplingOptions options;
    options.temperature = f->temperature;
    options.top_k = f->top_k;
    Rng rng(f->seed);
    stream_generate(model, encode_bytes(prompt), f->tokens, options, rng);
    std::printf("\n");
  });
}

}  // namespace cabm::cli
