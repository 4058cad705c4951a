// Bytes → the text-data path of `cabm train --data` / `cabm eval --data` and the fortunes
// corpus, on a buffer: the UTF-8 check and position split (split_text, what load_text_file does
// after reading), the fortune-file parse and hash split, the training and evaluation windows,
// byte tokens and the printing repair (Utf8Stream). The first byte picks a window length.
#include "cabm/io/text_data.h"
#include "cabm/io/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

#include <vector>

namespace {

void check_windows(std::string_view text, int64_t T) {
  if (static_cast<int64_t>(text.size()) < T + 1) return;
  constexpr int64_t B = 3;
  std::vector<int64_t> inputs(B * T), targets(B * T);
  cabm::Rng rng(7);
  cabm::sample_windows(text, B, T, rng, inputs.data(), targets.data());
  const std::vector<int64_t> offsets = cabm::evaluation_offsets(text, T, 5);
  std::vector<int64_t> eval_inputs(offsets.size() * static_cast<size_t>(T)), eval_targets(eval_inputs.size());
  for (const int64_t o : offsets)
    if (o < 0 || o + T + 1 > static_cast<int64_t>(text.size()))
      cabm::fuzz::invariant_failed("an evaluation window runs outside the text");
  cabm::gather_windows(text, offsets, 0, static_cast<int64_t>(offsets.size()), T, eval_inputs.data(),
                       eval_targets.data());
}

void text_data(std::string_view bytes) {
  if (bytes.empty()) return;
  const int64_t T = 1 + static_cast<unsigned char>(bytes[0]) % 32;
  bytes.remove_prefix(1);

  // Tokens and printing work on any bytes.
  const std::vector<int64_t> tokens = cabm::encode_bytes(bytes);
  if (cabm::decode_bytes(tokens) != bytes) cabm::fuzz::invariant_failed("byte tokens do not round-trip");
  cabm::Utf8Stream stream;
  std::string printed;
  for (const char c : bytes) printed += stream.push(static_cast<uint8_t>(c));
  printed += stream.finish();
  if (cabm::find_invalid_utf8(printed)) cabm::fuzz::invariant_failed("Utf8Stream printed invalid UTF-8");
  const bool valid = !cabm::find_invalid_utf8(bytes);
  if (valid && printed != bytes) cabm::fuzz::invariant_failed("Utf8Stream changed valid UTF-8");

  // Fortunes: entries are cleaned, and the split keeps every entry.
  const std::vector<std::string> entries = cabm::parse_fortunes(bytes);
  if (!entries.empty()) {
    const cabm::TextSplit fortunes = cabm::split_documents(entries, 0.05, "fuzz-fortunes");
    if (fortunes.train_documents + fortunes.validation_documents != static_cast<int64_t>(entries.size()))
      cabm::fuzz::invariant_failed("split_documents lost entries");
    check_windows(fortunes.train, T);
  }

  // --data FILE: valid UTF-8 or an error; the split loses and adds nothing.
  cabm::fuzz::run([&] {
    const cabm::TextSplit split = cabm::split_text(std::string(bytes), 0.1, "fuzz.txt");
    if (!valid) cabm::fuzz::invariant_failed("split_text accepted invalid UTF-8");
    if (split.train + split.validation != bytes) cabm::fuzz::invariant_failed("split_text lost or added bytes");
    check_windows(split.train, T);
    check_windows(split.validation, T);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { text_data(cabm::fuzz::as_text(data, size)); });
}
