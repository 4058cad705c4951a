// `cabm attention`: the attention kernel as a file contract (docs/attention_file.md): q, k, v
// and the variants' tensors and metadata in, out and lse (and the gradients, given dout) out.
#include "cli/commands.h"
#include "cli/flags.h"

#include "cabm/interop/attention_file.h"
#include "cabm/io/safetensors.h"

#include <memory>

namespace cabm::cli {

namespace {

struct AttentionArgs {
  std::string input;
  std::string output;
  std::string precision = "fp32";
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

void run_attention(const AttentionArgs& args) {
  apply_threads(args.threads_option, args.threads);
  const Precision precision = parse_precision(args.precision);
  write_safetensors(args.output, run_attention_file(read_safetensors(args.input), precision));
}

}  // namespace

void register_attention(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention", "Run the attention kernel on q, k, v (GQA, masks, causal, windows, ALiBi, soft-cap, sinks, "
                   "rotary) from a safetensors file; with dout, the backward too");
  cmd->add_option("--input", args->input,
                  "safetensors file: q [B,N,Hq,d], k [B,M,Hkv,d], v [B,M,Hkv,dv]; optional mask, alibi_slopes, "
                  "sinks, q_positions, k_positions, dout; metadata scale, causal, window_left, window_right, alibi, "
                  "softcap, rope, rope_theta, rope_dim (docs/attention_file.md)")
      ->required();
  cmd->add_option("--output", args->output, "safetensors file to write: out, lse (and dq, dk, dv, dsinks)")
      ->required();
  cmd->add_option("--precision", args->precision,
                  "fp32 (default) or bf16: q, k, v rounded to bf16, products with fp32 accumulation")
      ->check(accepted_by([](const std::string& s) { parse_precision(s); }, "fp32 or bf16"));
  args->threads_option = add_threads_option(cmd, args->threads);
  cmd->callback([args] { run_attention(*args); });
}

}  // namespace cabm::cli
