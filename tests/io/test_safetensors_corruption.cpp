// Safetensors under random corruption of a valid file (every variant reads or throws a
// cabm::Error naming the file, never crashes; run it under the asan preset too), and the in-memory
// reader against the file reader.
#include "cabm/io/safetensors.h"

#include "util/safetensors_files.h"
#include "util/test_util.h"

#include <cstring>
#include <random>
#include <string>

// Inside the helpers' namespace (util/safetensors_files.h) for their names.
namespace cabm::test {
namespace {

TEST(SafetensorsCorruption, ReadsOrThrowsNeverCrashes) {
  const std::string valid_path = temp_path("valid.safetensors");
  write_safetensors(valid_path, every_dtype(), {{"module", "TransformerEncoder"}, {"nhead", "2"}});
  const std::string valid = read_file(valid_path);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, valid.data(), 8);

  std::mt19937_64 rng(20240607);
  const auto uniform = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const std::string path = temp_path("corrupt.safetensors");
  int read_ok = 0, threw = 0;
  for (int variant = 0; variant < 400; ++variant) {
    std::string bytes = valid;
    // Most positions in the header, where a flip changes meaning; some in the length and data.
    const auto position = [&] {
      const uint64_t r = uniform(10);
      if (r < 7) return 8 + uniform(header_bytes);
      if (r < 8) return uniform(8);
      return uniform(bytes.size());
    };
    const int mutations = 1 + static_cast<int>(uniform(3));
    for (int m = 0; m < mutations && !bytes.empty(); ++m) {
      switch (uniform(5)) {
        case 0:
          bytes[position() % bytes.size()] ^= static_cast<char>(1u << uniform(8));
          break;
        case 1:
          bytes[position() % bytes.size()] = static_cast<char>(uniform(256));
          break;
        case 2:
          bytes.resize(uniform(bytes.size()));
          break;
        case 3:
          bytes.erase(position() % bytes.size(), 1);
          break;
        case 4:
          bytes.insert(position() % bytes.size(), 1, "{}[],:\"0-9e \xff"[uniform(14)]);
          break;
      }
    }
    write_bytes(path, bytes);
    try {
      const SafetensorsFile file = read_safetensors(path);
      uint64_t total = 0;
      for (const auto& [name, t] : file.tensors) {
        EXPECT_TRUE(t.is_contiguous());
        total += t.nbytes();
      }
      EXPECT_LE(total, 2 * bytes.size()) << "variant " << variant;  // F16 doubles, nothing more
      ++read_ok;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << "variant " << variant << ": " << e.what();
      ++threw;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "variant " << variant << " threw a non-cabm exception: " << e.what();
    }
  }
  EXPECT_GT(threw, 100);  // the mutations do break files
  EXPECT_GT(read_ok, 0);  // and some, e.g. flips in float data, still read
}

// parse_safetensors (bytes in memory; what tests/fuzz/fuzz_safetensors runs) and
// read_safetensors (a file) are one reader: for the valid file and for corrupted ones, the same
// tensors or the same message, with the name given in place of the path.
TEST(SafetensorsInMemory, AgreesWithTheFileReader) {
  const std::string valid_path = temp_path("memory_valid.safetensors");
  write_safetensors(valid_path, every_dtype(), {{"k", "v"}});
  const std::string valid = read_file(valid_path);
  const std::string path = temp_path("memory.safetensors");
  std::mt19937_64 rng(7);
  int read_ok = 0, threw = 0;
  for (int variant = 0; variant < 200; ++variant) {
    std::string bytes = valid;
    if (variant > 0) {
      const size_t at = std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng);
      if (variant % 5 == 0)
        bytes.resize(at);
      else
        bytes[at] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    }
    write_bytes(path, bytes);
    std::string file_error, memory_error;
    SafetensorsFile from_file, from_memory;
    try {
      from_file = read_safetensors(path);
    } catch (const Error& e) {
      file_error = e.what();
    }
    try {
      from_memory = parse_safetensors(bytes, path);
    } catch (const Error& e) {
      memory_error = e.what();
    }
    SCOPED_TRACE("variant " + std::to_string(variant));
    EXPECT_EQ(memory_error, file_error);
    if (!file_error.empty()) {
      ++threw;
      continue;
    }
    ++read_ok;
    EXPECT_EQ(from_memory.path, path);
    EXPECT_EQ(from_memory.metadata, from_file.metadata);
    ASSERT_EQ(from_memory.tensors.size(), from_file.tensors.size());
    for (const auto& [name, t] : from_file.tensors) expect_same(from_memory.get(name), t, name);
  }
  EXPECT_GT(threw, 20);
  EXPECT_GT(read_ok, 20);
  EXPECT_NE(error_of([] {
              parse_safetensors(std::string_view("\x05\0\0\0", 4), "bytes.safetensors");
            }).find("bytes.safetensors: file is 4 bytes, too short"),
            std::string::npos);
}

}  // namespace
}  // namespace cabm::test
