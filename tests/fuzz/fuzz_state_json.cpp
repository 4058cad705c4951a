// Bytes → a checkpoint's state.json, read as every command reads it: the JSON parse and the
// object check of load_checkpoint, checkpoint_step, saved_train_config (train_config_from_json
// + validate), the data-stream position and step of restore_optimizer_and_data (against an
// empty AdamW state), and the keys cabm eval / generate look at. A configuration that is read
// must survive to_json → train_config_from_json unchanged.
#include "cabm/train/checkpoint.h"
#include "cabm/train/json_reader.h"
#include "cabm/train/train_config.h"
#include "cabm/train/train_run.h"
#include "cabm/train/training_state.h"
#include "tests/fuzz/fuzz_util.h"

#include <nlohmann/json.hpp>

namespace {

using cabm::Error;

void read_state(std::string_view text) {
  cabm::LoadedCheckpoint checkpoint;
  checkpoint.dir = "fuzz-checkpoint";
  const std::string path = cabm::state_file_path(checkpoint);
  // As load_checkpoint does.
  try {
    checkpoint.state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", path, cabm::json_error_text(e)));
  }
  if (!checkpoint.state.is_object()) throw Error(fmt::format("{}: expected a JSON object", path));
  const int64_t step = cabm::checkpoint_step(checkpoint);

  // cabm eval / generate: the data file and eval windows, each independent of the rest.
  cabm::fuzz::run([&] {
    const cabm::JsonReader state(checkpoint.state, path);
    if (!state.has("config")) return;
    const cabm::JsonReader config = state.object("config");
    if (config.has("data")) (void)config.string("data");
    if (config.has("eval_windows")) (void)config.integer("eval_windows", 1, cabm::kMaxCount);
  });

  // Resume: the data stream and step, against an optimizer file of no parameters.
  cabm::fuzz::run([&] {
    cabm::SafetensorsFile optimizer;
    optimizer.path = "fuzz-checkpoint/optimizer.safetensors";
    optimizer.metadata = {{"optimizer", "AdamW"}, {"step", std::to_string(step)}};
    checkpoint.optimizer = optimizer;
    cabm::AdamW opt;
    cabm::Rng data_rng;
    cabm::restore_optimizer_and_data(checkpoint, opt, data_rng);
  });

  const cabm::TrainConfig config = cabm::saved_train_config(checkpoint);
  const nlohmann::json saved = cabm::to_json(config);
  const cabm::TrainConfig again = cabm::train_config_from_json(saved, path, "config.");
  if (cabm::to_json(again) != saved) cabm::fuzz::invariant_failed("to_json / train_config_from_json do not round-trip");
  cabm::check_resume_config(config, again);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { read_state(cabm::fuzz::as_text(data, size)); });
}
