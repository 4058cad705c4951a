// `cabm classify`: the labels a Hugging Face *ForSequenceClassification directory gives the lines
// of a text file (the contract in docs/hf_models.md).
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/hf_cli.h"
#include "cli/progress.h"

#include "cabm/core/error.h"
#include "cabm/interop/hf_pipeline.h"
#include "cabm/io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

namespace cabm::cli {

namespace {

struct ClassifyArgs {
  std::string model;
  std::string input;
  std::string pair_input;  // "": single texts
  std::string output;      // "": print only
  int64_t top_k = 1;
  int64_t max_length = 0;
  int64_t batch_size = 32;
  std::string precision = "fp32";
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

void run_classify(const ClassifyArgs& args) {
  apply_threads(args.threads_option, args.threads);
  const Precision precision = parse_precision(args.precision);
  const HfJob job = load_hf_job(args.model, args.input, args.pair_input, args.max_length, 0, precision);
  const HfEncoder& model = job.model;
  if (!model.has_classifier())
    throw Error(
        fmt::format("{}: {} has no classification head ('architectures' must name a "
                    "*ForSequenceClassification)",
                    model.config.path, model.config.architecture));
  const int64_t n = static_cast<int64_t>(job.sequences.size());
  CountProgress progress("classify", n, n > args.batch_size && Progress::stderr_is_terminal());
  const Tensor logits =
      hf_logits(model, job.sequences, {args.batch_size, [&](int64_t done, int64_t) { progress.update(done); }});
  progress.finish();
  if (!args.output.empty()) write_safetensors(args.output, {{"logits", logits}});  // temporary name, then renamed

  // One line per input: its number, then the top labels and probabilities, tab-separated.
  const Tensor probs = hf_probabilities(logits, model.config.multi_label);
  const int64_t L = model.num_labels(), k = std::min(args.top_k, L);
  const float* p = probs.data<float>();
  std::vector<int64_t> order(static_cast<size_t>(L));
  std::string text;
  for (int64_t i = 0; i < n; ++i) {
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[i * L + a] > p[i * L + b]; });
    text += std::to_string(i + 1);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t label = order[static_cast<size_t>(j)];
      text += fmt::format("\t{}\t{:.4f}", model.config.id2label[static_cast<size_t>(label)], p[i * L + label]);
    }
    text += '\n';
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void register_classify(CLI::App& app) {
  auto args = std::make_shared<ClassifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "classify",
      "Label text lines with a Hugging Face *ForSequenceClassification directory (BERT, RoBERTa, XLM-R, "
      "DistilBERT)");
  cmd->add_option("--model", args->model, "model directory: config.json (id2label), model.safetensors, tokenizer")
      ->required();
  cmd->add_option("--input", args->input, "UTF-8 text, one input per line ('-': standard input)")->required();
  add_pair_input_option(cmd, args->pair_input);
  cmd->add_option("--output", args->output, "safetensors file to write: logits F32 [n, num_labels]");
  cmd->add_option("--top-k", args->top_k, "labels printed per input, most probable first (default 1)")
      ->check(integer_in(1, int64_t{1} << 31));
  cmd->add_option(
         "--max-length", args->max_length,
         "truncate each input (a pair as a whole) to N tokens, special tokens included (default: the tokenizer's "
         "model_max_length)")
      ->check(integer_in(1, kHfMaxLength));
  cmd->add_option("--batch-size", args->batch_size, "texts per batch, sorted by length (default 32)")
      ->check(integer_in(1, kHfMaxBatch));
  cmd->add_option("--precision", args->precision, "fp32 (default) or bf16")
      ->check(accepted_by([](const std::string& s) { parse_precision(s); }, "fp32 or bf16"));
  args->threads_option = add_threads_option(cmd, args->threads);
  cmd->callback([args] { run_classify(*args); });
}

}  // namespace cabm::cli
