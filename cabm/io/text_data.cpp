#include "cabm/io/text_data.h"

#include "cabm/core/error.h"
#include "cabm/core/memory.h"
#include "cabm/io/tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>

namespace cabm {

namespace fs = std::filesystem;

namespace {

// A pipe or socket (`--data <(zcat corpus.gz)`) has no size to check in advance: read up to this
// much, and refuse a longer stream rather than return a part of it.
constexpr size_t kMaxStreamBytes = size_t{1} << 30;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// read(2) into dst until `want` bytes or the end; returns the bytes read.
size_t read_some(const std::string& path, int fd, char* dst, size_t want) {
  size_t done = 0;
  while (done < want) {
    const ssize_t got = ::read(fd, dst + done, want - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(fmt::format("{}: read error: {}", path, std::strerror(errno)));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

std::string read_stream(const std::string& path, int fd) {
  std::string out;
  constexpr size_t kChunk = size_t{1} << 20;
  try {
    for (;;) {
      const size_t at = out.size();
      out.resize(at + kChunk);
      const size_t got = read_some(path, fd, out.data() + at, kChunk);
      out.resize(at + got);
      if (got < kChunk) return out;
      if (out.size() > kMaxStreamBytes)
        throw Error(fmt::format("{}: not a regular file, and longer than {} (save it to a file first)", path,
                                human_bytes(static_cast<double>(kMaxStreamBytes))));
    }
  } catch (const std::bad_alloc&) {
    throw Error(fmt::format("{}: out of memory after reading {} bytes", path, out.size()));
  }
}

}  // namespace

std::string read_file_bytes(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(fmt::format("{}: cannot access: {}", path, ec.message()));
  if (ec || !fs::exists(status)) throw Error(fmt::format("{}: no such file", path));
  if (fs::is_directory(status)) throw Error(fmt::format("{}: is a directory, expected a file", path));
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) throw Error(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  // A device has no end (/dev/zero, /dev/urandom) or is not text (/dev/sda).
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
    throw Error(fmt::format("{}: is a device, expected a regular file", path));
  if (!S_ISREG(st.st_mode)) return read_stream(path, file.fd);

  // The whole file or an error: never the prefix that fitted.
  const auto size = static_cast<size_t>(st.st_size);
  check_fits_in_memory(static_cast<double>(size), fmt::format("{}: reading the whole file", path));
  std::string out;
  try {
    out.resize(size);
  } catch (const std::exception&) {  // bad_alloc, length_error
    throw Error(fmt::format("{}: out of memory reading its {} ({} bytes)", path, human_bytes(static_cast<double>(size)),
                            size));
  }
  const size_t got = read_some(path, file.fd, out.data(), size);
  if (got != size)
    throw Error(fmt::format("{}: ended at byte {} of {} (changed while being read?)", path, got, size));
  char extra = 0;
  if (read_some(path, file.fd, &extra, 1) != 0)
    throw Error(fmt::format("{}: grew past its {} bytes while being read", path, size));
  return out;
}

void check_utf8_text(std::string_view text, const std::string& source) {
  if (text.empty()) throw Error(fmt::format("{}: file is empty", source));
  if (const auto bad = find_invalid_utf8(text))
    throw Error(fmt::format("{}: not valid UTF-8 (byte offset {})", source, *bad));
}

std::string read_utf8_file(const std::string& path) {
  std::string text = read_file_bytes(path);
  check_utf8_text(text, path);
  return text;
}

namespace {

// Resolves "X\bY" overstrikes to "Y" and drops control characters other than \t and \n.
std::string clean_entry(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (const char ch : raw) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\b') {
      // Remove the whole previous character (its UTF-8 continuation bytes too).
      while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
      if (!out.empty()) out.pop_back();
    } else if (c == '\r') {
      continue;
    } else if (c < 0x20 && c != '\n' && c != '\t') {
      continue;
    } else if (c == 0x7F) {
      continue;
    } else {
      out.push_back(ch);
    }
  }
  // Trailing whitespace and blank lines carry nothing.
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\t')) out.pop_back();
  return out;
}

}  // namespace

std::vector<std::string> parse_fortunes(std::string_view text) {
  std::vector<std::string> entries;
  std::string current;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%") {
      std::string entry = clean_entry(current);
      if (!entry.empty()) entries.push_back(std::move(entry));
      current.clear();
    } else {
      current.append(line);
      current.push_back('\n');
    }
    pos = end + 1;
  }
  std::string entry = clean_entry(current);
  if (!entry.empty()) entries.push_back(std::move(entry));
  return entries;
}

std::vector<std::string> read_fortune_entries(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(fmt::format(
        "{}: no such directory (the fortunes corpus; install the 'fortunes' package or pass --data FILE)", dir));
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    // Plain files only: skips the .u8 symlinks (duplicates), off/ and other directories.
    if (item.is_symlink() || !item.is_regular_file()) continue;
    const fs::path& p = item.path();
    if (p.extension() == ".dat" || p.extension() == ".u8") continue;
    files.push_back(p);
  }
  if (ec) throw Error(fmt::format("{}: cannot list: {}", dir, ec.message()));
  std::sort(files.begin(), files.end());
  std::vector<std::string> entries;
  for (const auto& p : files) {
    const std::string text = read_file_bytes(p.string());
    if (find_invalid_utf8(text)) continue;  // a non-UTF-8 fortune file (none in Debian 12)
    auto parsed = parse_fortunes(text);
    for (auto& e : parsed) entries.push_back(std::move(e));
  }
  if (entries.empty()) throw Error(fmt::format("{}: no fortune entries found", dir));
  return entries;
}

uint64_t text_hash(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

TextSplit split_documents(const std::vector<std::string>& documents, double validation_fraction,
                          const std::string& source) {
  CABM_CHECK(validation_fraction > 0 && validation_fraction < 1, "validation fraction must lie in (0, 1)");
  TextSplit split;
  split.source = source;
  const auto threshold = static_cast<uint64_t>(validation_fraction * 1e6);
  for (const auto& doc : documents) {
    // Mix the FNV hash once more so that its low decimal digits are well spread.
    uint64_t h = text_hash(doc);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    const bool held_out = (h % 1000000) < threshold;
    std::string& out = held_out ? split.validation : split.train;
    out += doc;
    out += "\n%\n";
    ++(held_out ? split.validation_documents : split.train_documents);
  }
  return split;
}

TextSplit load_fortunes(const std::string& dir, double validation_fraction) {
  return split_documents(read_fortune_entries(dir), validation_fraction, dir);
}

TextSplit load_text_file(const std::string& path, double validation_fraction) {
  CABM_CHECK(validation_fraction > 0 && validation_fraction < 1, "validation fraction must lie in (0, 1)");
  return split_text(read_utf8_file(path), validation_fraction, path);
}

TextSplit split_text(std::string text, double validation_fraction, const std::string& source) {
  CABM_CHECK(validation_fraction > 0 && validation_fraction < 1, "validation fraction must lie in (0, 1)");
  check_utf8_text(text, source);
  size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - validation_fraction));
  // Start the held-out part at a line boundary when one is near (within 1/4 of it).
  const size_t newline = text.find('\n', cut);
  if (newline != std::string::npos && newline + 1 < text.size() &&
      newline + 1 - cut <= static_cast<size_t>(static_cast<double>(text.size()) * validation_fraction / 4))
    cut = newline + 1;
  TextSplit split;
  split.source = source;
  split.validation = text.substr(cut);
  text.resize(cut);
  split.train = std::move(text);
  split.train_documents = 1;
  split.validation_documents = 1;
  return split;
}

void sample_windows(std::string_view text, int64_t B, int64_t T, Rng& rng, int64_t* inputs, int64_t* targets) {
  const auto n = static_cast<int64_t>(text.size());
  CABM_CHECK(n >= T + 1, "text of {} bytes is shorter than one window of {}", n, T + 1);
  const auto range = static_cast<uint64_t>(n - T);  // offsets 0 .. n - T - 1
  for (int64_t b = 0; b < B; ++b) {
    // Lemire's multiply-shift maps 32 random bits onto [0, range) (range < 2^32 here).
    const auto o = static_cast<int64_t>((static_cast<uint64_t>(rng.next_u32()) * range) >> 32);
    for (int64_t t = 0; t < T; ++t) {
      inputs[b * T + t] = static_cast<unsigned char>(text[static_cast<size_t>(o + t)]);
      targets[b * T + t] = static_cast<unsigned char>(text[static_cast<size_t>(o + t + 1)]);
    }
  }
}

std::vector<int64_t> evaluation_offsets(std::string_view text, int64_t T, int64_t max_windows) {
  const auto n = static_cast<int64_t>(text.size());
  CABM_CHECK(n >= T + 1, "text of {} bytes is shorter than one window of {}", n, T + 1);
  const int64_t last = n - T - 1;  // largest valid offset
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(max_windows, last / T + 1));
  std::vector<int64_t> offsets(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) offsets[static_cast<size_t>(i)] = count == 1 ? 0 : i * last / (count - 1);
  return offsets;
}

void gather_windows(std::string_view text, const std::vector<int64_t>& offsets, int64_t first, int64_t count, int64_t T,
                    int64_t* inputs, int64_t* targets) {
  for (int64_t b = 0; b < count; ++b) {
    const int64_t o = offsets[static_cast<size_t>(first + b)];
    for (int64_t t = 0; t < T; ++t) {
      inputs[b * T + t] = static_cast<unsigned char>(text[static_cast<size_t>(o + t)]);
      targets[b * T + t] = static_cast<unsigned char>(text[static_cast<size_t>(o + t + 1)]);
    }
  }
}

}  // namespace cabm
