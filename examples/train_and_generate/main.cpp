// Trains a small character-level language model with the library call behind `cabm train`
// (validation and checkpoints included), then loads the saved checkpoint as a program that
// only wants the model would, checks it scores the held-out text as the run did, and samples
// a continuation.
//
//   train_and_generate RUN_DIR [TEXT_FILE]     (default text: Debian's fortunes)
#include <cabm/cabm.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s RUN_DIR [TEXT_FILE]\n", argv[0]);
    return 2;
  }
  try {
    cabm::TrainConfig config = cabm::default_train_config(cabm::TrainTask::kLanguageModel);
    config.out_dir = argv[1];
    if (argc == 3) config.data = argv[2];
    config.layers = 2;
    config.d_model = 64;
    config.d_ff = 256;
    config.steps = 300;
    config.eval_interval = 150;
    config.schedule.warmup = 20;

    cabm::TrainCallbacks callbacks;
    callbacks.on_eval = [](const cabm::EvalReport& r) {
      std::printf("step %lld: validation loss %.4f\n", static_cast<long long>(r.step), r.loss);
    };
    callbacks.on_checkpoint = [](int64_t step, const std::string& dir) {
      std::printf("step %lld: checkpoint %s\n", static_cast<long long>(step), dir.c_str());
    };
    const cabm::TrainResult result = cabm::train(config, callbacks);
    if (!result.last_eval) return 1;

    // A fresh start from the files alone: the checkpoint's model file says how to rebuild it.
    const cabm::LoadedCheckpoint checkpoint = cabm::load_checkpoint(result.checkpoint, false);
    const cabm::CausalLM model = cabm::load_causal_lm(checkpoint.model);
    const cabm::TextSplit text = config.data.empty() ? cabm::load_fortunes() : cabm::load_text_file(config.data);
    const double reloaded = cabm::evaluate_lm(model, text.validation, config.seq_len, config.eval_windows,
                                              config.batch_size);
    std::printf("reloaded %s: validation loss %.4f (the run's: %.4f)\n", result.checkpoint.c_str(), reloaded,
                result.last_eval->loss);
    if (reloaded != result.last_eval->loss) {
      std::printf("MISMATCH\n");
      return 1;
    }

    cabm::SamplingOptions sampling;  // temperature 0.8 over all 256 bytes
    cabm::Rng rng(1);
    const std::string prompt = config.data.empty() ? "%\n" : "\n";
    std::string sample = cabm::decode_bytes(cabm::generate(model, cabm::encode_bytes(prompt), 120, sampling, rng));
    for (char& c : sample)
      if ((c < 0x20 && c != '\n') || c == 0x7f) c = '?';  // keep the terminal safe
    std::printf("sample: %s\n", sample.c_str());
  } catch (const cabm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
