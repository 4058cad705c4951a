// `cabm forward`: run a PyTorch TransformerEncoder, TransformerEncoderLayer or
// MultiheadAttention state_dict on inputs from a safetensors file (the contract in DESIGN.md
// and docs/forward.md).
#include "cli/commands.h"
#include "cli/flags.h"

#include "cabm/core/threads.h"
#include "cabm/interop/pytorch_forward.h"
#include "cabm/io/safetensors.h"
#include "cabm/nn/mixed_precision.h"

#include <fmt/format.h>

#include <memory>

namespace cabm::cli {

namespace {

struct ForwardArgs {
  std::string model;
  std::string input;
  std::string output;
  std::string precision = "fp32";
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

void run_forward(const ForwardArgs& args) {
  apply_threads(args.threads_option, args.threads);
  const Precision precision = parse_precision(args.precision);
  const SafetensorsFile model = read_safetensors(args.model);
  const SafetensorsFile in = read_safetensors(args.input);
  write_safetensors(args.output, run_pytorch_module(model, in, precision));
}

}  // namespace

void register_forward(CLI::App& app) {
  auto args = std::make_shared<ForwardArgs>();
  CLI::App* cmd = app.add_subcommand(
      "forward", "Run a PyTorch TransformerEncoder, TransformerEncoderLayer or MultiheadAttention state_dict on inputs");
  cmd->add_option("--model", args->model, "safetensors file with the module's state_dict and metadata")->required();
  cmd->add_option("--input", args->input, "safetensors file with the inputs (src or query/key/value, masks)")
      ->required();
  cmd->add_option("--output", args->output, "safetensors file to write: output (and attn_weights)")->required();
  args->threads_option = add_threads_option(cmd, args->threads);
  cmd->add_option("--precision", args->precision,
                  "fp32 (default: PyTorch's numbers) or bf16: weights rounded to bf16 copies, bf16 matrix products "
                  "and attention with fp32 accumulation (need_weights: fp32 reference on bf16-rounded Q, K, V)")
      ->check(accepted_by([](const std::string& s) { parse_precision(s); }, "fp32 or bf16"));
  cmd->callback([args] { run_forward(*args); });
}

}  // namespace cabm::cli
