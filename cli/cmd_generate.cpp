// `cabm generate`: sample text from a trained causal LM checkpoint, streamed as it is
// generated (one incremental KV-cache step per byte).
#include "cli/commands.h"
#include "cli/flags.h"
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
#include "cabm/train/json_reader.h"
#include "cabm/train/train_config.h"
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
  cmd->add_option("--tokens", f->tokens, "bytes to generate (default 500)")->check(integer_in(0, kMaxCount));
  // Temperatures below ~1e-30 overflow exp(logit / t) in float; 0 is greedy.
  cmd->add_option("--temperature", f->temperature, "sampling temperature; 0 = greedy (default 0.8)")
      ->check(real_in({0, 1e6}));
  cmd->add_option("--top-k", f->top_k, "sample among the k most likely bytes only; 0 = all (default 0)")
      ->check(integer_in(0, kInt64Max));
  cmd->add_option("--seed", f->seed, "sampling seed (default 1)")->check(any_unsigned());
  f->threads_option = add_threads_option(cmd, f->threads);
  cmd->add_option("--precision", f->precision,
                  "fp32 (default) or bf16: bf16 weight copies and matrix products, bf16 KV cache (half the memory)")
      ->check(accepted_by([](const std::string& s) { parse_precision(s); }, "fp32 or bf16"));

  cmd->callback([f] {
    apply_threads(f->threads_option, f->threads);
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
      const JsonReader state(checkpoint.state, state_file_path(checkpoint));
      const bool fortunes = !state.has("config") || !state.object("config").has("data") ||
                            state.object("config").string("data").empty();
      prompt = fortunes ? "%\n" : "\n";
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
