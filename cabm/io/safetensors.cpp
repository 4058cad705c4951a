#include "cabm/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

namespace cabm {

// Data is copied between the file and tensors byte for byte.
static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so must the host be");

namespace {

using nlohmann::json;

// The reference implementation's limit; a larger length means the file is not safetensors.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// ---------------------------------------------------------------------------------------------
// Errors: every message starts with the file's path.

template <typename... Args>
[[noreturn]] void fail(const std::string& path, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(path + ": " + fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, fmt::format_string<Args...> format,
                              Args&&... args) {
  throw Error(fmt::format("{}: tensor '{}': ", path, name) + fmt::format(format, std::forward<Args>(args)...));
}

std::string errno_str() { return std::strerror(errno); }

// ---------------------------------------------------------------------------------------------
// Dtypes a file may hold, and what each becomes in memory.

enum class Conversion { kNone, kF16ToF32, kF64ToF32, kI32ToI64 };

struct FileDType {
  std::string_view name;
  uint64_t size;  // bytes per element in the file
  DType to;
  Conversion conversion;
};

constexpr FileDType kFileDTypes[] = {
    {"F32", 4, DType::F32, Conversion::kNone},        {"BF16", 2, DType::BF16, Conversion::kNone},
    {"BOOL", 1, DType::BOOL, Conversion::kNone},      {"I64", 8, DType::I64, Conversion::kNone},
    {"F16", 2, DType::F32, Conversion::kF16ToF32},    {"F64", 8, DType::F32, Conversion::kF64ToF32},
    {"I32", 4, DType::I64, Conversion::kI32ToI64},
};

const FileDType* find_file_dtype(std::string_view name) {
  for (const FileDType& d : kFileDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

// IEEE round to nearest, written out because a double beyond float's range is undefined
// behaviour for static_cast. Above FLT_MAX + half an ulp (2^103) the result is ±inf.
float f64_to_f32(double x) {
  if (std::isnan(x) || std::fabs(x) <= FLT_MAX) return static_cast<float>(x);
  const double overflow = static_cast<double>(FLT_MAX) + 0x1p103;
  const float magnitude = std::fabs(x) < overflow ? FLT_MAX : INFINITY;
  return x < 0 ? -magnitude : magnitude;
}

// ---------------------------------------------------------------------------------------------
// Reading.

// A file open for reading at any offset.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, "cannot open: {}", errno_str());
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(path, "cannot stat: {}", errno_str());
    if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }

  // Fills dst with `bytes` bytes from `offset`; `what` names the part being read in errors.
  void read_at(uint64_t offset, void* dst, uint64_t bytes, const std::string& what) const {
    char* out = static_cast<char*>(dst);
    while (bytes > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{1} << 30));
      const ssize_t got = ::pread(fd_, out, want, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(path_, "reading {} at byte {}: {}", what, offset, errno_str());
      if (got == 0) fail(path_, "file ended at byte {} while reading {} (truncated while being read?)", offset, what);
      out += got;
      offset += static_cast<uint64_t>(got);
      bytes -= static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The same interface over bytes in memory (parse_safetensors): a file that is already read.
class MemoryInput {
 public:
  MemoryInput(std::string_view bytes, const std::string& name) : bytes_(bytes), path_(name) {}

  uint64_t size() const { return bytes_.size(); }

  void read_at(uint64_t offset, void* dst, uint64_t bytes, const std::string& what) const {
    if (offset > bytes_.size() || bytes > bytes_.size() - offset)
      fail(path_, "file ended at byte {} while reading {}", std::min<uint64_t>(offset, bytes_.size()), what);
    if (bytes > 0) std::memcpy(dst, bytes_.data() + offset, static_cast<size_t>(bytes));
  }

 private:
  std::string_view bytes_;
  std::string path_;
};

// Parses the header, rejecting repeated keys in any object (nlohmann would keep the last one
// silently, so a file could mean two things).
json parse_header(const std::string& path, const std::string& text) {
  if (text.empty() || text[0] != '{') fail(path, "header does not start with '{{' (not a safetensors file?)");
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore what follows it.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    fail(path, "header is not valid JSON: NUL byte at header offset {}", nul);
  struct Object {
    std::string owner;  // the key whose value this object is (unused at the top)
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Object> objects;  // the objects open at this point of the parse
  const json::parser_callback_t check_keys = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      objects.push_back({objects.empty() ? std::string() : objects.back().last_key, {}, {}});
    } else if (event == json::parse_event_t::object_end) {
      objects.pop_back();
    } else if (event == json::parse_event_t::key) {
      Object& object = objects.back();
      object.last_key = parsed.get<std::string>();
      if (!object.keys.insert(object.last_key).second) {
        if (objects.size() == 1) fail(path, "header repeats the key '{}'", object.last_key);
        fail(path, "header repeats the key '{}' in '{}'", object.last_key, object.owner);
      }
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, check_keys);
  } catch (const json::exception& e) {
    fail(path, "header is not valid JSON: {}", e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");
  return header;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& value) {
  if (!value.is_object()) fail(path, "__metadata__ is not an object of strings but {}", value.type_name());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) fail(path, "metadata value for '{}' is not a string but {}", key, item.type_name());
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// A header entry, checked against itself and the buffer's size.
struct Entry {
  std::string name;
  const FileDType* dtype = nullptr;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the buffer
};

const json& require_field(const std::string& path, const std::string& name, const json& entry, const char* field) {
  const auto it = entry.find(field);
  if (it == entry.end()) fail_tensor(path, name, "entry has no '{}'", field);
  return *it;
}

// A JSON array of non-negative integers that fit int64 (sizes and offsets).
std::vector<int64_t> parse_sizes(const std::string& path, const std::string& name, const json& value,
                                 const char* field) {
  if (!value.is_array()) fail_tensor(path, name, "'{}' is not an array but {}", field, value.type_name());
  std::vector<int64_t> out;
  out.reserve(value.size());
  for (const json& item : value) {
    if (!item.is_number_integer())  // floats (2.0 too), strings, ...
      fail_tensor(path, name, "'{}' {} holds something other than a non-negative integer", field, value.dump());
    if (!item.is_number_unsigned()) {  // nlohmann keeps "-0" and negatives as signed
      const int64_t v = item.get<int64_t>();
      if (v < 0) fail_tensor(path, name, "'{}' {} holds a negative number", field, value.dump());
      out.push_back(v);
      continue;
    }
    const uint64_t v = item.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(path, name, "'{}' {} holds a number too large", field, value.dump());
    out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

// Element count, or nullopt when the product of the non-zero sizes overflows int64 (Tensor's
// own shape and stride arithmetic multiplies them, zero or not).
std::optional<uint64_t> checked_numel(const Shape& shape) {
  int64_t nonzero = 1;
  bool has_zero = false;
  for (int64_t s : shape) {
    if (s == 0) has_zero = true;
    else if (__builtin_mul_overflow(nonzero, s, &nonzero)) return std::nullopt;
  }
  return has_zero ? 0 : static_cast<uint64_t>(nonzero);
}

Entry parse_entry(const std::string& path, const std::string& name, const json& value, uint64_t buffer_bytes) {
  if (!value.is_object()) fail_tensor(path, name, "entry is not an object but {}", value.type_name());
  Entry e;
  e.name = name;

  const json& dtype = require_field(path, name, value, "dtype");
  if (!dtype.is_string()) fail_tensor(path, name, "'dtype' is not a string but {}", dtype.type_name());
  e.dtype = find_file_dtype(dtype.get<std::string>());
  if (e.dtype == nullptr)
    fail_tensor(path, name, "dtype '{}' is not supported (cabm reads F32, BF16, F16, F64, BOOL, I64, I32)",
                dtype.get<std::string>());

  e.shape = parse_sizes(path, name, require_field(path, name, value, "shape"), "shape");

  const json& offsets_json = require_field(path, name, value, "data_offsets");
  const std::vector<int64_t> offsets = parse_sizes(path, name, offsets_json, "data_offsets");
  if (offsets.size() != 2) fail_tensor(path, name, "'data_offsets' {} is not [begin, end]", offsets_json.dump());
  e.begin = static_cast<uint64_t>(offsets[0]);
  e.end = static_cast<uint64_t>(offsets[1]);
  if (e.begin > e.end) fail_tensor(path, name, "data_offsets [{}, {}] end before they begin", e.begin, e.end);
  if (e.end > buffer_bytes)
    fail_tensor(path, name, "data_offsets [{}, {}] run past the end of the {}-byte data buffer (truncated?)", e.begin,
                e.end, buffer_bytes);

  const std::optional<uint64_t> numel = checked_numel(e.shape);
  uint64_t needed = 0;
  if (!numel || __builtin_mul_overflow(*numel, e.dtype->size, &needed))
    fail_tensor(path, name, "shape {} {} is too large", shape_str(e.shape), e.dtype->name);
  if (needed != e.end - e.begin)
    fail_tensor(path, name, "data_offsets [{}, {}] hold {} bytes, shape {} {} needs {}", e.begin, e.end,
                e.end - e.begin, shape_str(e.shape), e.dtype->name, needed);
  return e;
}

// The spec requires the buffer to be indexed entirely, without holes or overlaps. Sorts
// `entries` by position.
void check_coverage(const std::string& path, std::vector<Entry>& entries, uint64_t buffer_bytes) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;  // bytes [0, covered) belong to tensors seen so far
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      fail_tensor(path, e.name, "data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", e.begin, e.end,
                  previous->name, previous->begin, previous->end);
    if (e.begin > covered)
      fail_tensor(path, e.name, "data_offsets [{}, {}] leave buffer bytes [{}, {}) unused (the spec allows no holes)",
                  e.begin, e.end, covered, e.begin);
    covered = e.end;
    previous = &e;
  }
  if (covered != buffer_bytes) {
    if (previous == nullptr) fail(path, "header lists no tensors but the data buffer holds {} bytes", buffer_bytes);
    fail(path, "data buffer bytes [{}, {}) after tensor '{}' belong to no tensor (the spec allows no holes)", covered,
         buffer_bytes, previous->name);
  }
}

// Reads `count` elements of type From at `offset`, converting each into dst, a chunk at a time
// so a converted tensor never needs a second full-size copy.
template <typename From, typename To, typename Convert, typename Source>
void read_converted(const Source& file, uint64_t offset, uint64_t count, To* dst, Convert convert,
                    const std::string& what) {
  constexpr uint64_t kChunk = uint64_t{1} << 16;
  std::vector<From> chunk(static_cast<size_t>(std::min(count, kChunk)));
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(kChunk, count - done);
    file.read_at(offset + done * sizeof(From), chunk.data(), n * sizeof(From), what);
    for (uint64_t i = 0; i < n; ++i) dst[done + i] = convert(chunk[i]);
    done += n;
  }
}

void check_bool_bytes(const std::string& path, const Tensor& t, const std::string& name) {
  const uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (p[i] > 1) fail_tensor(path, name, "BOOL element {} is {}, not 0 or 1", i, p[i]);
}

template <typename Source>
Tensor read_tensor(const std::string& path, const Source& file, uint64_t buffer_start, const Entry& e) {
  Tensor t = Tensor::empty(e.shape, e.dtype->to);
  const uint64_t offset = buffer_start + e.begin;
  const uint64_t count = static_cast<uint64_t>(t.numel());
  const std::string what = fmt::format("tensor '{}'", e.name);
  switch (e.dtype->conversion) {
    case Conversion::kNone: file.read_at(offset, t.raw_data(), e.end - e.begin, what); break;
    case Conversion::kF16ToF32:
      read_converted<uint16_t>(file, offset, count, t.data<float>(), half_bits_to_float, what);
      break;
    case Conversion::kF64ToF32: read_converted<double>(file, offset, count, t.data<float>(), f64_to_f32, what); break;
    case Conversion::kI32ToI64:
      read_converted<int32_t>(file, offset, count, t.data<int64_t>(), [](int32_t v) { return int64_t{v}; }, what);
      break;
  }
  if (t.dtype() == DType::BOOL) check_bool_bytes(path, t, e.name);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Writing.

// A temporary file next to `path` that becomes `path` on commit() and is removed otherwise.
class AtomicOutputFile {
 public:
  explicit AtomicOutputFile(const std::string& path) : path_(path) {
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; fd_ < 0; ++attempt) {
      temp_path_ = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
      fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && (errno != EEXIST || attempt > 100))
        fail(path, "cannot create temporary file '{}': {}", temp_path_, errno_str());
    }
  }
  ~AtomicOutputFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_path_.c_str());
  }
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  void write(const void* data, uint64_t bytes) {
    const char* in = static_cast<const char*>(data);
    while (bytes > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{1} << 30));
      const ssize_t put = ::write(fd_, in, want);
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) fail(path_, "writing '{}': {}", temp_path_, errno_str());
      in += put;
      bytes -= static_cast<uint64_t>(put);
    }
  }

  // Flushes to disk before the rename, so that after a crash `path` is the old file or the new
  // one, never a prefix of the new one.
  void commit() {
    if (::fsync(fd_) != 0) fail(path_, "flushing '{}': {}", temp_path_, errno_str());
    const int closed = ::close(fd_);
    fd_ = -1;
    if (closed != 0) fail(path_, "closing '{}': {}", temp_path_, errno_str());
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
      fail(path_, "renaming '{}' to it: {}", temp_path_, errno_str());
    committed_ = true;
  }

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// The header text, padded with spaces so that the buffer after it starts 8-byte aligned.
std::string make_header(const std::string& path, const std::map<std::string, Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {  // std::map: sorted by name
    if (name == "__metadata__") fail(path, "'__metadata__' is reserved and cannot name a tensor");
    if (!t.defined()) fail(path, "tensor '{}' is undefined", name);
    const uint64_t bytes = t.nbytes();
    header[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    fail(path, "a tensor name or metadata string is not valid UTF-8 ({})", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + size is then a multiple of 8
  return text;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

const Tensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

const Tensor& SafetensorsFile::get(const std::string& name) const {
  const Tensor* t = find(name);
  if (t == nullptr) fail(path, "missing tensor '{}'", name);
  return *t;
}

const Tensor& SafetensorsFile::get(const std::string& name, DType dtype, const Shape& shape) const {
  const Tensor& t = get(name);
  if (t.dtype() != dtype) fail_tensor(path, name, "has dtype {}, expected {}", dtype_name(t.dtype()), dtype_name(dtype));
  bool matches = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; matches && i < shape.size(); ++i) matches = shape[i] == -1 || shape[i] == t.shape()[i];
  if (!matches) {
    std::string expected = shape_str(shape);
    if (std::find(shape.begin(), shape.end(), -1) != shape.end()) expected += " (-1: any size)";
    fail_tensor(path, name, "has shape {}, expected {}", shape_str(t.shape()), expected);
  }
  return t;
}

const std::string* SafetensorsFile::find_metadata(const std::string& key) const {
  const auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

const std::string& SafetensorsFile::get_metadata(const std::string& key) const {
  const std::string* value = find_metadata(key);
  if (value == nullptr) fail(path, "missing metadata '{}'", key);
  return *value;
}

namespace {

// The reader over either source; `path` names it in errors.
template <typename Source>
SafetensorsFile read_from(const std::string& path, const Source& file) {
  if (file.size() < 8) fail(path, "file is {} bytes, too short for a safetensors header (8-byte length first)", file.size());
  uint64_t header_bytes = 0;
  file.read_at(0, &header_bytes, 8, "the header length");
  if (header_bytes > kMaxHeaderBytes)
    fail(path, "header length {} exceeds the {}-byte limit (not a safetensors file?)", header_bytes, kMaxHeaderBytes);
  if (header_bytes > file.size() - 8)
    fail(path, "header length {} runs past the end of the {}-byte file (truncated?)", header_bytes, file.size());
  std::string text(static_cast<size_t>(header_bytes), '\0');
  file.read_at(8, text.data(), header_bytes, "the header");
  const json header = parse_header(path, text);
  text = std::string();

  const uint64_t buffer_start = 8 + header_bytes;
  const uint64_t buffer_bytes = file.size() - buffer_start;
  SafetensorsFile out;
  out.path = path;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") out.metadata = parse_metadata(path, value);
    else entries.push_back(parse_entry(path, name, value, buffer_bytes));
  }
  check_coverage(path, entries, buffer_bytes);

  // Only now, with every entry checked, allocate; read in file order.
  for (const Entry& e : entries) out.tensors.emplace(e.name, read_tensor(path, file, buffer_start, e));
  return out;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  const InputFile file(path);
  return read_from(path, file);
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name) {
  const MemoryInput input(bytes, name);
  return read_from(name, input);
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = make_header(path, tensors, metadata);
  const uint64_t header_bytes = header.size();

  AtomicOutputFile file(path);
  file.write(&header_bytes, 8);
  file.write(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    const Tensor c = t.contiguous();  // one copy at a time, and only of strided views
    if (c.dtype() == DType::BOOL) check_bool_bytes(path, c, name);  // never write what we would not read
    file.write(c.raw_data(), c.nbytes());
  }
  file.commit();
}

}  // namespace cabm
