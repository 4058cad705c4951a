// `cabm embed`: sentence embeddings (or the last hidden states) of a Hugging Face BERT-family
// model directory on the lines of a text file (the contract in docs/hf_models.md).
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/hf_cli.h"
#include "cli/progress.h"

#include "cabm/core/error.h"
#include "cabm/interop/hf_config.h"
#include "cabm/interop/hf_pipeline.h"
#include "cabm/io/safetensors.h"

#include <fmt/format.h>

#include <memory>

namespace cabm::cli {

namespace {

struct EmbedArgs {
  std::string model;
  std::string input;
  std::string pair_input;  // "": single texts
  std::string output;
  std::string pooling;  // "": the directory's sentence-transformers modules, else mean
  bool normalize = false;
  int64_t max_length = 0;
  int64_t batch_size = 32;
  std::string precision = "fp32";
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

void run_embed(const EmbedArgs& args) {
  check_pair_input(args.input, args.pair_input);
  apply_threads(args.threads_option, args.threads);
  const Precision precision = parse_precision(args.precision);
  // --pooling overrides the directory's sentence-transformers modules (which are then not read).
  HfPooling pooling = HfPooling::kMean;
  bool normalize = args.normalize;
  if (!args.pooling.empty()) {
    pooling = parse_pooling(args.pooling);
  } else if (const SentenceTransformersConfig st = read_sentence_transformers_config(args.model); st.present) {
    pooling = st.pooling;
    normalize = normalize || st.normalize;
  }
  if (pooling == HfPooling::kNone && args.normalize)
    throw UsageError("--normalize needs --pooling mean or cls (--pooling none writes the hidden states as they are)");
  const HfJob job = load_hf_job(args.model, args.input, args.pair_input, args.max_length,
                                read_sentence_transformers_max_length(args.model), precision);
  const int64_t n = static_cast<int64_t>(job.sequences.size());
  CountProgress progress("embed", n, n > args.batch_size && Progress::stderr_is_terminal());
  HfBatchOptions options{args.batch_size, [&](int64_t done, int64_t) { progress.update(done); }};
  std::map<std::string, Tensor> out;
  const char* pooling_name = pooling == HfPooling::kMean ? "mean" : pooling == HfPooling::kCls ? "cls" : "none";
  const std::map<std::string, std::string> metadata{
      {"pooling", pooling_name}, {"normalize", normalize ? "true" : "false"}, {"precision", precision_name(precision)}};
  if (pooling == HfPooling::kNone) {
    HfHiddenStates h = hf_hidden_states(job.model, job.sequences, options);
    out["last_hidden_state"] = h.last_hidden_state;
    out["attention_mask"] = h.attention_mask;
  } else {
    out["embeddings"] = hf_embed(job.model, job.sequences, pooling, normalize, options);
  }
  progress.finish();
  write_safetensors(args.output, out, metadata);  // written under a temporary name, then renamed
}

}  // namespace

void register_embed(CLI::App& app) {
  auto args = std::make_shared<EmbedArgs>();
  CLI::App* cmd = app.add_subcommand(
      "embed", "Sentence embeddings of text lines with a Hugging Face BERT, RoBERTa, XLM-R or DistilBERT directory");
  cmd->add_option("--model", args->model, "model directory: config.json, model.safetensors and tokenizer files")
      ->required();
  cmd->add_option("--input", args->input, "UTF-8 text, one input per line ('-': standard input)")->required();
  add_pair_input_option(cmd, args->pair_input);
  cmd->add_option("--output", args->output,
                  "safetensors file to write: embeddings F32 [n, E] (--pooling none: last_hidden_state F32 [n, T, E] "
                  "and attention_mask I64 [n, T])")
      ->required();
  cmd->add_option("--pooling", args->pooling,
                  "mean (over the tokens, as sentence-transformers), cls (the first token) or none (default: the "
                  "directory's sentence-transformers modules, else mean)")
      ->check(accepted_by([](const std::string& s) { parse_pooling(s); }, "mean, cls or none"));
  cmd->add_flag("--normalize", args->normalize, "divide each embedding by its L2 norm");
  cmd->add_option("--max-length", args->max_length,
                  "truncate each input (a pair as a whole) to N tokens, special tokens included (default: "
                  "sentence_bert_config.json's "
                  "max_seq_length, else the tokenizer's model_max_length)")
      ->check(integer_in(1, kHfMaxLength));
  cmd->add_option("--batch-size", args->batch_size,
                  "texts per batch; texts are sorted by length so that a batch holds similar lengths (default 32)")
      ->check(integer_in(1, kHfMaxBatch));
  cmd->add_option("--precision", args->precision,
                  "fp32 (default) or bf16: the encoder layers' products on bf16 weight copies, fp32 accumulation")
      ->check(accepted_by([](const std::string& s) { parse_precision(s); }, "fp32 or bf16"));
  args->threads_option = add_threads_option(cmd, args->threads);
  cmd->callback([args] { run_embed(*args); });
}

}  // namespace cabm::cli
