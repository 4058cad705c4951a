// Bytes → parse_safetensors (the reader behind read_safetensors, on memory). A file that parses
// must satisfy what the reader promises: every tensor owns contiguous memory of a dtype cabm
// computes in, and BOOL bytes are 0/1.
#include "cabm/io/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] {
    const cabm::SafetensorsFile file = cabm::parse_safetensors(cabm::fuzz::as_text(data, size), "fuzz.safetensors");
    for (const auto& [name, t] : file.tensors) {
      if (!t.is_contiguous()) cabm::fuzz::invariant_failed("a tensor read from a file is not contiguous");
      const cabm::DType d = t.dtype();
      if (d != cabm::DType::F32 && d != cabm::DType::BF16 && d != cabm::DType::BOOL && d != cabm::DType::I64)
        cabm::fuzz::invariant_failed("a tensor read from a file has a dtype other than F32, BF16, BOOL, I64");
      if (d == cabm::DType::BOOL)
        for (int64_t i = 0; i < t.numel(); ++i)
          if (t.data<uint8_t>()[i] > 1) cabm::fuzz::invariant_failed("a BOOL byte other than 0/1 was accepted");
      (void)file.get(name);
    }
    for (const auto& [key, value] : file.metadata) (void)file.get_metadata(key);
  });
}
