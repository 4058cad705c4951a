// `cabm tokenize`: a Hugging Face model directory's tokenizer on the lines of a text file,
// written as transformers' fast tokenizer returns them with padding=True, truncation=True
// (the contract in docs/tokenizers.md).
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/hf_cli.h"
#include "cli/progress.h"

#include "cabm/core/error.h"
#include "cabm/io/hf_tokenizer.h"
#include "cabm/io/safetensors.h"
#include "cabm/io/text_lines.h"

#include <fmt/format.h>

#include <memory>

namespace cabm::cli {

namespace {

// Beyond any model's positions, and small enough that [n, T] stays addressable.
constexpr int64_t kMaxLength = int64_t{1} << 24;

struct TokenizeArgs {
  std::string model;
  std::string input;
  std::string pair_input;  // "": single texts
  std::string output;
  int64_t max_length = 0;  // 0: the tokenizer's own maximum
};

void run_tokenize(const TokenizeArgs& args) {
  check_pair_input(args.input, args.pair_input);
  const bool pair = !args.pair_input.empty();
  const HfTokenizer tokenizer = HfTokenizer::load(args.model);
  if (args.max_length > 0 && args.max_length < tokenizer.special_token_count(pair))
    throw UsageError(fmt::format("--max-length {} leaves no room for the {} special tokens of {}{}", args.max_length,
                                 tokenizer.special_token_count(pair), args.model, pair ? " around a pair" : ""));
  const HfTexts in = read_hf_texts(args.input, args.pair_input);
  const size_t n = in.texts.size();
  std::vector<TokenizedText> encoded;
  encoded.reserve(n);
  // On a terminal, a progress line for inputs that take longer than a tenth of a second.
  CountProgress progress("tokenize", static_cast<int64_t>(n), Progress::stderr_is_terminal());
  for (size_t i = 0; i < n; ++i) {
    progress.update(static_cast<int64_t>(i));
    try {
      encoded.push_back(pair ? tokenizer.encode_pair(in.texts[i], in.pairs[i], args.max_length)
                             : tokenizer.encode(in.texts[i], args.max_length));
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw Error(fmt::format("{}: line {}: {}", in.source, i + 1, e.what()));
    }
  }
  progress.finish();
  write_safetensors(args.output, pad_batch(encoded, tokenizer.pad_id(), tokenizer.has_token_types()));
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text lines with a Hugging Face model directory's tokenizer (as transformers' fast tokenizer "
      "with padding=True, truncation=True)");
  cmd->add_option("--model", args->model,
                  "model directory: tokenizer.json, or vocab.txt, vocab.json + merges.txt, sentencepiece.bpe.model")
      ->required();
  cmd->add_option("--input", args->input, "UTF-8 text, one input per line ('-': standard input)")->required();
  add_pair_input_option(cmd, args->pair_input);
  cmd->add_option("--output", args->output,
                  "safetensors file to write: input_ids, attention_mask (and token_type_ids), I64 [n, T]")
      ->required();
  cmd->add_option("--max-length", args->max_length,
                  "truncate each input (a pair as a whole, longest_first) to N tokens, special tokens included "
                  "(default: the tokenizer's model_max_length)")
      ->check(integer_in(1, kMaxLength));
  cmd->callback([args] { run_tokenize(*args); });
}

}  // namespace cabm::cli
