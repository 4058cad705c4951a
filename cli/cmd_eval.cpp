// `cabm eval`: validation metrics of a checkpoint. A causal LM: loss (nats per byte), bits per
// byte and bits per character on the held-out split of its training data, or on a whole
// --data FILE. A classifier: loss, accuracy and confusion matrix on held-out words.
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "cabm/core/error.h"
#include "cabm/core/threads.h"
#include "cabm/interop/state_dict.h"
#include "cabm/io/text_data.h"
#include "cabm/io/word_lists.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/json_reader.h"
#include "cabm/train/langid_trainer.h"
#include "cabm/train/lm_trainer.h"
#include "cabm/train/model_config.h"

#include <cmath>
#include <cstdio>
#include <memory>

namespace cabm::cli {

namespace {

// Windows (or words) per forward pass: each holds B·T·V logits, so beyond this the pass is
// larger than any useful batch.
constexpr int64_t kMaxEvalBatch = 4096;

// The training data recorded in state.json ("" = fortunes, also when there is no state).
std::string saved_data(const LoadedCheckpoint& checkpoint) {
  const JsonReader state(checkpoint.state, state_file_path(checkpoint));
  if (!state.has("config")) return "";
  const JsonReader config = state.object("config");
  return config.has("data") ? config.string("data") : "";
}

struct EvalFlags {
  std::string checkpoint, data;
  int64_t max_windows = 0;
  int64_t batch_size = 16;
  int threads = 0;
  CLI::Option* data_option = nullptr;
  CLI::Option* threads_option = nullptr;
};

int64_t count_code_points(std::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

void eval_lm(const EvalFlags& f, const LoadedCheckpoint& checkpoint) {
  const CausalLM model = load_causal_lm(checkpoint.model);
  const int64_t T = model.config.max_seq_len;
  std::string text, what;
  if (f.data_option->count() > 0) {
    text = read_utf8_file(f.data);
    what = fmt::format("{} (whole file)", f.data);
  } else {
    const std::string data = saved_data(checkpoint);
    TextSplit split = data.empty() ? load_fortunes() : load_text_file(data);
    text = std::move(split.validation);
    what = fmt::format("held-out split of {}", split.source);
  }
  if (static_cast<int64_t>(text.size()) < T + 1)
    throw Error(fmt::format("{}: {} bytes, fewer than one window of the model's context {} + 1", what, text.size(), T));
  const int64_t windows = f.max_windows > 0 ? f.max_windows : static_cast<int64_t>(text.size());
  const int64_t used = static_cast<int64_t>(evaluation_offsets(text, T, windows).size());
  const double loss = evaluate_lm(model, text, T, windows, f.batch_size);
  const double bits_per_byte = loss / std::log(2.0);
  const double bytes_per_char = static_cast<double>(text.size()) / static_cast<double>(count_code_points(text));
  std::printf("checkpoint %s, step %lld\n", checkpoint.dir.c_str(),
              static_cast<long long>(checkpoint_step(checkpoint)));
  std::printf("data: %s: %s bytes, %lld windows of %lld\n", what.c_str(),
              format_count(static_cast<double>(text.size())).c_str(), static_cast<long long>(used),
              static_cast<long long>(T));
  std::printf("validation loss %.4f nats/byte | %.4f bits/byte | %.4f bits/char | perplexity %.3f per byte\n", loss,
              bits_per_byte, bits_per_byte * bytes_per_char, std::exp(loss));
}

void eval_langid(const EvalFlags& f, const LoadedCheckpoint& checkpoint) {
  if (f.data_option->count() > 0) throw Error("--data applies to language-model checkpoints; this one is a classifier");
  std::vector<std::string> labels;
  const Classifier model = load_classifier(checkpoint.model, labels);
  const ClassifierConfig& config = model.config;
  WordListOptions options;
  options.max_bytes = config.max_seq_len;
  const JsonReader state(checkpoint.state, state_file_path(checkpoint));
  if (state.has("config") && state.object("config").has("eval_windows"))
    options.validation_per_language = state.object("config").integer("eval_windows", 1, kMaxCount);
  const WordDataset data = load_word_lists(default_word_lists(), options);
  if (data.languages != labels) throw Error(fmt::format("{}: its classes differ from the word lists'", checkpoint.dir));
  const ClassifierEval result = evaluate_classifier(model, data, config.max_seq_len, 256);
  std::printf("checkpoint %s, step %lld\n", checkpoint.dir.c_str(),
              static_cast<long long>(checkpoint_step(checkpoint)));
  std::printf("validation loss %.4f | accuracy %.2f%% (%zu held-out words per language)\n", result.loss,
              100.0 * result.accuracy, data.validation.front().size());
  std::printf("%s", format_confusion(labels, result.confusion).c_str());
}

}  // namespace

void register_eval(CLI::App& app) {
  CLI::App* cmd =
      app.add_subcommand("eval", "Validation loss and bits per character of a checkpoint (accuracy for langid)");
  auto f = std::make_shared<EvalFlags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint directory, or a run directory (its latest checkpoint)")
      ->required();
  f->data_option = cmd->add_option(
      "--data", f->data, "UTF-8 text file to evaluate on, whole (default: the held-out split of the training data)");
  cmd->add_option("--max-windows", f->max_windows, "evaluate at most this many windows (default: all)")
      ->check(integer_in(0, kInt64Max));
  cmd->add_option("--batch-size", f->batch_size, "windows per forward pass (default 16)")
      ->check(integer_in(1, kMaxEvalBatch));
  f->threads_option = add_threads_option(cmd, f->threads);
  cmd->callback([f] {
    apply_threads(f->threads_option, f->threads);
    const LoadedCheckpoint checkpoint = load_checkpoint(f->checkpoint, false);
    const std::string kind = model_kind(checkpoint.model);
    if (kind == "CausalLM")
      eval_lm(*f, checkpoint);
    else if (kind == "Classifier")
      eval_langid(*f, checkpoint);
    else
      throw Error(
          fmt::format("{}: not a cabm training checkpoint (metadata model = '{}')", checkpoint.model.path, kind));
  });
}

}  // namespace cabm::cli
