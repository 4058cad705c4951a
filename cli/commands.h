// Registration of the `cabm` subcommands; each is defined in cli/cmd_<name>.cpp.
#pragma once

#include <CLI/CLI.hpp>

namespace cabm::cli {

void register_forward(CLI::App& app);
void register_attention(CLI::App& app);  // cmd_attention.cpp
void register_train(CLI::App& app);     // cmd_train.cpp
void register_generate(CLI::App& app);  // cmd_generate.cpp
void register_eval(CLI::App& app);      // cmd_eval.cpp
void register_bench(CLI::App& app);     // cmd_bench.cpp
// Adds `bench layer` and `bench train` to the "bench" subcommand (call after register_bench).
void register_bench_model(CLI::App& app);  // cmd_bench_model.cpp
// Adds `bench decode` (call after register_bench).
void register_bench_decode(CLI::App& app);  // cmd_bench_decode.cpp
void register_memory(CLI::App& app);    // cmd_memory.cpp
void register_tokenize(CLI::App& app);  // cmd_tokenize.cpp
void register_embed(CLI::App& app);     // cmd_embed.cpp
void register_classify(CLI::App& app);  // cmd_classify.cpp

}  // namespace cabm::cli
