// Safetensors read/write: round trips of every dtype, conversions on read, every malformed
// file we can think of (each must be a cabm::Error naming the file and what is wrong). Random
// corruption of a valid file and the in-memory reader: test_safetensors_corruption.cpp.
#include "cabm/io/safetensors.h"

#include "util/safetensors_files.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

namespace cabm {
namespace {

using test::every_dtype;
using test::expect_same;
using test::temp_path;
using test::write_bytes;

std::string u64_bytes(uint64_t v) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &v, 8);
  return out;
}

// A file by hand: the 8-byte header length, the header text as given, the buffer.
std::string make_file(const std::string& header, const std::string& buffer = "") {
  return u64_bytes(header.size()) + header + buffer;
}

template <typename T>
std::string raw(std::initializer_list<T> values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

// The message read_safetensors throws for these bytes (written to a file called `name`).
std::string read_error_for(const std::string& name, const std::string& bytes) {
  const std::string path = temp_path(name);
  write_bytes(path, bytes);
  try {
    read_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << name << ": read succeeded, expected a cabm::Error";
  return "";
}

// Every message starts with the file's path and contains each of `parts`.
#define EXPECT_READ_ERROR(name, bytes, ...)                                                         \
  do {                                                                                              \
    const std::string message_ = read_error_for((name), (bytes));                                   \
    EXPECT_EQ(message_.rfind(temp_path(name) + ": ", 0), 0u) << "does not start with the path: " << message_; \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})                         \
      EXPECT_NE(message_.find(part_), std::string::npos) << "'" << part_ << "' not in: " << message_; \
  } while (0)

// A one-tensor header: {"w": {"dtype": DTYPE, "shape": SHAPE, "data_offsets": OFFSETS}}.
std::string entry_header(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
}

// ---------------------------------------------------------------------------------------------
// Round trips and the written layout.

TEST(Safetensors, RoundTripEveryDtype) {
  const std::string path = temp_path("every_dtype.safetensors");
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> metadata = {
      {"module", "TransformerEncoder"}, {"nhead", "4"}, {"note", "µ \"quoted\" \\ \n"}, {"empty", ""}};
  write_safetensors(path, tensors, metadata);
  const SafetensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.path, path);
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) expect_same(file.get(name), t, name);
}

TEST(Safetensors, RoundTripNonContiguous) {
  const std::string path = temp_path("strided.safetensors");
  const Tensor base = test::random_tensor({4, 6}, 3);
  std::map<std::string, Tensor> tensors;
  tensors["transposed"] = base.as_strided({6, 4}, {1, 6});
  tensors["narrowed"] = base.narrow(1, 1, 3);
  tensors["column"] = base.select(1, 5);
  Tensor ids = Tensor::empty({3, 4}, DType::I64);
  for (int64_t i = 0; i < 12; ++i) ids.data<int64_t>()[i] = i * 1000;
  tensors["ids_every_other"] = ids.as_strided({3, 2}, {4, 2}, 1);
  Tensor mask = Tensor::zeros({4, 4}, DType::BOOL);
  for (int64_t i = 0; i < 4; ++i) mask.data<uint8_t>()[i * 5] = 1;
  tensors["mask_transposed"] = mask.as_strided({4, 4}, {1, 4});
  ASSERT_FALSE(tensors["transposed"].is_contiguous());
  write_safetensors(path, tensors);
  const SafetensorsFile file = read_safetensors(path);
  for (const auto& [name, t] : tensors) expect_same(file.get(name), t, name);
  EXPECT_EQ(file.get("ids_every_other").to_vector(), (std::vector<float>{1000, 3000, 5000, 7000, 9000, 11000}));
}

TEST(Safetensors, WrittenLayoutFollowsTheSpec) {
  const std::string path = temp_path("layout.safetensors");
  std::map<std::string, Tensor> tensors;
  tensors["b"] = Tensor::full({3}, 1.0f);                  // 12 bytes
  tensors["a"] = Tensor::zeros({1}, DType::BOOL);           // 1 byte
  tensors["c"] = Tensor::zeros({2}, DType::I64);            // 16 bytes
  write_safetensors(path, tensors, {{"k", "v"}});
  const std::string bytes = test::read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "the buffer must start 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + n + 12 + 1 + 16);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}')) << "padding is spaces after the JSON";
  const auto json = nlohmann::ordered_json::parse(header);
  std::vector<std::string> keys;
  for (const auto& [key, value] : json.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "a", "b", "c"}));
  EXPECT_EQ(json["a"]["data_offsets"], nlohmann::ordered_json::parse("[0, 1]"));
  EXPECT_EQ(json["b"]["data_offsets"], nlohmann::ordered_json::parse("[1, 13]"));
  EXPECT_EQ(json["c"]["data_offsets"], nlohmann::ordered_json::parse("[13, 29]"));
  EXPECT_EQ(json["c"]["dtype"], "I64");
  EXPECT_EQ(json["b"]["shape"], nlohmann::ordered_json::parse("[3]"));
}

TEST(Safetensors, EmptyFileAndEmptyMetadata) {
  const std::string path = temp_path("empty.safetensors");
  write_safetensors(path, {});
  EXPECT_EQ(test::read_file(path), u64_bytes(8) + "{}      ");  // no __metadata__ when there is none
  const SafetensorsFile file = read_safetensors(path);
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST(Safetensors, OverwriteLeavesNoTemporaryFiles) {
  const std::string dir = temp_path("overwrite");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/model.safetensors";
  write_safetensors(path, {{"x", Tensor::full({2}, 1.0f)}});
  write_safetensors(path, {{"y", Tensor::full({3}, 2.0f)}});
  const SafetensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.find("x"), nullptr);
  EXPECT_EQ(file.get("y").to_vector(), (std::vector<float>{2, 2, 2}));
  // A failed write keeps the old file and removes its temporary.
  Tensor bad = Tensor::zeros({2}, DType::BOOL);
  bad.data<uint8_t>()[1] = 2;
  EXPECT_THROW(write_safetensors(path, {{"a", Tensor::full({1}, 0.0f)}, {"bad", bad}}), Error);
  EXPECT_NE(read_safetensors(path).find("y"), nullptr);
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++entries;
    EXPECT_EQ(entry.path().filename(), "model.safetensors");
  }
  EXPECT_EQ(entries, 1);
}

// ---------------------------------------------------------------------------------------------
// Conversions on read: F16 and F64 to F32, I32 to I64.

TEST(Safetensors, ReadsF16AsF32Exactly) {
  const std::string path = temp_path("f16.safetensors");
  const std::string data = raw<uint16_t>({0x3C00, 0xC000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x8000});
  write_bytes(path, make_file(entry_header("F16", "[3, 3]", "[0, 18]"), data));
  const Tensor t = read_safetensors(path).get("w", DType::F32, {3, 3});
  const float* p = t.data<float>();
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[1], -2.0f);
  EXPECT_EQ(p[2], std::ldexp(1.0f, -24));        // smallest subnormal
  EXPECT_EQ(p[3], std::ldexp(1023.0f, -24));     // largest subnormal
  EXPECT_EQ(p[4], 65504.0f);                     // largest finite half
  EXPECT_EQ(p[5], INFINITY);
  EXPECT_EQ(p[6], -INFINITY);
  EXPECT_TRUE(std::isnan(p[7]));
  EXPECT_TRUE(p[8] == 0.0f && std::signbit(p[8]));
}

TEST(Safetensors, ReadsF64AsF32RoundedToNearest) {
  const std::string path = temp_path("f64.safetensors");
  const double max = FLT_MAX;
  const std::string data =
      raw<double>({1.5, 0.1, -1e-300, 1e300, -1e300, max + 0x1p102, max + 0x1p103, std::nan(""), -0.0});
  write_bytes(path, make_file(entry_header("F64", "[9]", "[0, 72]"), data));
  const Tensor t = read_safetensors(path).get("w", DType::F32, {9});
  const float* p = t.data<float>();
  EXPECT_EQ(p[0], 1.5f);
  EXPECT_EQ(p[1], 0.1f);
  EXPECT_TRUE(p[2] == 0.0f && std::signbit(p[2]));
  EXPECT_EQ(p[3], INFINITY);
  EXPECT_EQ(p[4], -INFINITY);
  EXPECT_EQ(p[5], FLT_MAX);   // below the half-way point rounds down
  EXPECT_EQ(p[6], INFINITY);  // the tie rounds to even, which is inf
  EXPECT_TRUE(std::isnan(p[7]));
  EXPECT_TRUE(p[8] == 0.0f && std::signbit(p[8]));
}

TEST(Safetensors, ReadsI32AsI64) {
  const std::string path = temp_path("i32.safetensors");
  const std::string data = raw<int32_t>({std::numeric_limits<int32_t>::min(), -1, 0, std::numeric_limits<int32_t>::max()});
  write_bytes(path, make_file(entry_header("I32", "[2, 2]", "[0, 16]"), data));
  const Tensor t = read_safetensors(path).get("w", DType::I64, {-1, 2});
  const int64_t* p = t.data<int64_t>();
  EXPECT_EQ(p[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(p[1], -1);
  EXPECT_EQ(p[2], 0);
  EXPECT_EQ(p[3], std::numeric_limits<int32_t>::max());
}

TEST(Safetensors, LargeConvertedTensorCrossesChunks) {
  // More elements than one conversion chunk (2^16), with a tail.
  const std::string path = temp_path("f16_large.safetensors");
  const int64_t n = (1 << 17) + 5;
  std::string data(static_cast<size_t>(n) * 2, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i % 0x7C00);  // finite halves only
    std::memcpy(data.data() + 2 * i, &bits, 2);
  }
  write_bytes(path, make_file(entry_header("F16", "[" + std::to_string(n) + "]",
                                           "[0, " + std::to_string(2 * n) + "]"), data));
  const Tensor t = read_safetensors(path).get("w");
  for (int64_t i = 0; i < n; i += 997)
    ASSERT_EQ(t.data<float>()[i], half_bits_to_float(static_cast<uint16_t>(i % 0x7C00))) << i;
  EXPECT_EQ(t.data<float>()[n - 1], half_bits_to_float(static_cast<uint16_t>((n - 1) % 0x7C00)));
}

TEST(Safetensors, AcceptsWhatTheSpecAllows) {
  // Header padded with trailing spaces, zero-sized tensors at a boundary, unknown entry
  // fields, tensors listed out of offset order.
  const std::string path = temp_path("allowed.safetensors");
  const std::string header =
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16],"extra":[1,{"x":null}]},)"
      R"("z":{"dtype":"BF16","shape":[0,5],"data_offsets":[8,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}     )";
  write_bytes(path, make_file(header, raw<float>({1, 2, 3, 4})));
  const SafetensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.get("a").to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(file.get("b").to_vector(), (std::vector<float>{3, 4}));
  EXPECT_EQ(file.get("z").shape(), (Shape{0, 5}));
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile's lookups.

TEST(Safetensors, LookupsNameTheFileAndKey) {
  const std::string path = temp_path("lookup.safetensors");
  write_safetensors(path, {{"norm.weight", Tensor::full({4}, 1.0f)}}, {{"nhead", "2"}});
  const SafetensorsFile file = read_safetensors(path);
  EXPECT_NE(file.find("norm.weight"), nullptr);
  EXPECT_EQ(file.find("norm.bias"), nullptr);
  EXPECT_EQ(file.get_metadata("nhead"), "2");
  EXPECT_EQ(file.find_metadata("activation"), nullptr);
  EXPECT_EQ(file.get("norm.weight", DType::F32, {-1}).numel(), 4);
  const auto message = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([&] { file.get("norm.bias"); }), path + ": missing tensor 'norm.bias'");
  EXPECT_EQ(message([&] { file.get_metadata("module"); }), path + ": missing metadata 'module'");
  EXPECT_EQ(message([&] { file.get("norm.weight", DType::F32, {8}); }),
            path + ": tensor 'norm.weight': has shape [4], expected [8]");
  EXPECT_EQ(message([&] { file.get("norm.weight", DType::F32, {4, -1}); }),
            path + ": tensor 'norm.weight': has shape [4], expected [4, -1] (-1: any size)");
  EXPECT_EQ(message([&] { file.get("norm.weight", DType::BF16, {4}); }),
            path + ": tensor 'norm.weight': has dtype F32, expected BF16");
}

// ---------------------------------------------------------------------------------------------
// Malformed files: each a cabm::Error that names the file and says what is wrong.

TEST(SafetensorsMalformed, FileLevel) {
  EXPECT_READ_ERROR("empty.bin", "", "0 bytes", "too short");
  EXPECT_READ_ERROR("five.bin", "12345", "5 bytes", "too short");
  EXPECT_READ_ERROR("past_end.bin", u64_bytes(100) + "{}", "header length 100", "runs past the end", "10-byte file");
  EXPECT_READ_ERROR("huge_len.bin", u64_bytes(uint64_t{1} << 63) + "{}", "exceeds", "limit");
  EXPECT_READ_ERROR("max_len.bin", u64_bytes(~uint64_t{0}) + "{}", "exceeds");
  EXPECT_READ_ERROR("array.bin", make_file("[1, 2]"), "does not start with '{'");
  EXPECT_READ_ERROR("leading_space.bin", make_file(" {}"), "does not start with '{'");
  EXPECT_READ_ERROR("zero_len.bin", make_file(""), "does not start with '{'");
  EXPECT_READ_ERROR("bad_json.bin", make_file(R"({"w": })"), "not valid JSON");
  EXPECT_READ_ERROR("trailing_junk.bin", make_file(R"({} x)"), "not valid JSON");
  EXPECT_READ_ERROR("nul.bin", make_file(std::string("{}\0", 3)), "not valid JSON", "NUL byte at header offset 2");
  EXPECT_READ_ERROR("nul_junk.bin", make_file(std::string("{}\0junk", 7)), "NUL byte");
  EXPECT_READ_ERROR("not_utf8.bin", make_file("{\"w\xff\":{}}"), "not valid JSON");
  EXPECT_READ_ERROR("bad_surrogate.bin", make_file(R"({"\ud800":{}})"), "not valid JSON");
  EXPECT_READ_ERROR("deep.bin", make_file("{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}"),
                    "tensor 'w'", "not an object");

  const std::string dir = temp_path("a_directory.safetensors");
  std::filesystem::create_directories(dir);
  try {
    read_safetensors(dir);
    ADD_FAILURE() << "reading a directory succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir + ": not a regular file");
  }
  const std::string missing = temp_path("missing.safetensors");
  try {
    read_safetensors(missing);
    ADD_FAILURE() << "reading a missing file succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), missing + ": cannot open: No such file or directory");
  }
}

TEST(SafetensorsMalformed, DuplicateKeys) {
  const std::string w = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  EXPECT_READ_ERROR("dup_tensor.bin", make_file(R"({"w":)" + w + R"(,"w":)" + w + "}", raw<float>({1})),
                    "repeats the key 'w'");
  EXPECT_READ_ERROR("dup_field.bin",
                    make_file(R"({"w":{"dtype":"F32","shape":[1],"dtype":"I64","data_offsets":[0,4]}})",
                              raw<float>({1})),
                    "repeats the key 'dtype' in 'w'");
  EXPECT_READ_ERROR("dup_metadata.bin", make_file(R"({"__metadata__":{"a":"1","a":"2"}})"),
                    "repeats the key 'a' in '__metadata__'");
  EXPECT_READ_ERROR("dup_in_empty_name.bin", make_file(R"({"":{"dtype":"F32","dtype":"F32"}})"),
                    "repeats the key 'dtype' in ''");
  // The same key in different objects is fine.
  const std::string path = temp_path("same_key_elsewhere.bin");
  write_bytes(path, make_file(R"({"__metadata__":{"w":"x"},"w":)" + w + "}", raw<float>({1})));
  EXPECT_EQ(read_safetensors(path).metadata.at("w"), "x");
}

TEST(SafetensorsMalformed, Metadata) {
  EXPECT_READ_ERROR("meta_array.bin", make_file(R"({"__metadata__":["a"]})"), "__metadata__ is not an object");
  EXPECT_READ_ERROR("meta_number.bin", make_file(R"({"__metadata__":{"nhead":4}})"),
                    "metadata value for 'nhead' is not a string");
  EXPECT_READ_ERROR("meta_null.bin", make_file(R"({"__metadata__":{"x":null}})"),
                    "metadata value for 'x' is not a string");
}

TEST(SafetensorsMalformed, EntryFields) {
  const std::string four = raw<float>({1});
  EXPECT_READ_ERROR("entry_number.bin", make_file(R"({"w":3})"), "tensor 'w'", "entry is not an object");
  EXPECT_READ_ERROR("no_dtype.bin", make_file(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", four), "tensor 'w'",
                    "has no 'dtype'");
  EXPECT_READ_ERROR("no_shape.bin", make_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", four), "tensor 'w'",
                    "has no 'shape'");
  EXPECT_READ_ERROR("no_offsets.bin", make_file(R"({"w":{"dtype":"F32","shape":[1]}})", four), "tensor 'w'",
                    "has no 'data_offsets'");
  EXPECT_READ_ERROR("dtype_number.bin", make_file(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", four),
                    "tensor 'w'", "'dtype' is not a string");
  for (const char* dtype : {"U8", "I8", "I16", "U16", "U32", "U64", "F8_E4M3", "f32", ""}) {
    EXPECT_READ_ERROR("dtype.bin", make_file(entry_header(dtype, "[4]", "[0,4]"), four), "tensor 'w'",
                      "dtype '" + std::string(dtype) + "' is not supported", "F16, F64");
  }
  EXPECT_READ_ERROR("shape_string.bin", make_file(entry_header("F32", R"("1")", "[0,4]"), four),
                    "'shape' is not an array");
  EXPECT_READ_ERROR("shape_negative.bin", make_file(entry_header("F32", "[2,-3]", "[0,4]"), four),
                    "tensor 'w'", "'shape' [2,-3] holds a negative number");
  EXPECT_READ_ERROR("shape_float.bin", make_file(entry_header("F32", "[1.0]", "[0,4]"), four),
                    "'shape' [1.0] holds something other than a non-negative integer");
  EXPECT_READ_ERROR("shape_bool.bin", make_file(entry_header("F32", "[true]", "[0,4]"), four),
                    "other than a non-negative integer");
  EXPECT_READ_ERROR("shape_nested.bin", make_file(entry_header("F32", "[[1]]", "[0,4]"), four),
                    "other than a non-negative integer");
  EXPECT_READ_ERROR("shape_huge.bin", make_file(entry_header("F32", "[18446744073709551615]", "[0,4]"), four),
                    "holds a number too large");
  EXPECT_READ_ERROR("shape_bigger.bin", make_file(entry_header("F32", "[1e30]", "[0,4]"), four),
                    "other than a non-negative integer");
  // "-0" is zero, not negative.
  const std::string path = temp_path("minus_zero.bin");
  write_bytes(path, make_file(entry_header("F32", "[-0, 3]", "[0,0]")));
  EXPECT_EQ(read_safetensors(path).get("w").shape(), (Shape{0, 3}));
}

TEST(SafetensorsMalformed, DataOffsets) {
  const std::string eight = raw<float>({1, 2});
  EXPECT_READ_ERROR("offsets_object.bin", make_file(entry_header("F32", "[2]", R"({"a":0})"), eight),
                    "'data_offsets' is not an array");
  EXPECT_READ_ERROR("offsets_one.bin", make_file(entry_header("F32", "[2]", "[8]"), eight),
                    "'data_offsets' [8] is not [begin, end]");
  EXPECT_READ_ERROR("offsets_three.bin", make_file(entry_header("F32", "[2]", "[0,4,8]"), eight),
                    "is not [begin, end]");
  EXPECT_READ_ERROR("offsets_negative.bin", make_file(entry_header("F32", "[2]", "[-8,0]"), eight),
                    "'data_offsets' [-8,0] holds a negative number");
  EXPECT_READ_ERROR("offsets_float.bin", make_file(entry_header("F32", "[2]", "[0,8.5]"), eight),
                    "other than a non-negative integer");
  EXPECT_READ_ERROR("offsets_reversed.bin", make_file(entry_header("F32", "[0]", "[8,4]"), eight),
                    "tensor 'w'", "data_offsets [8, 4] end before they begin");
  EXPECT_READ_ERROR("offsets_past.bin", make_file(entry_header("F32", "[4]", "[0,16]"), eight), "tensor 'w'",
                    "data_offsets [0, 16] run past the end of the 8-byte data buffer");
  EXPECT_READ_ERROR("offsets_huge.bin",
                    make_file(entry_header("F32", "[2]", "[9223372036854775800,9223372036854775807]"), eight),
                    "run past the end");
}

TEST(SafetensorsMalformed, SizeMismatch) {
  const std::string twelve = raw<float>({1, 2, 3});
  EXPECT_READ_ERROR("model.safetensors", make_file(R"({"layers.0.linear1.weight":)"
                                                   R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})",
                                                   twelve),
                    "tensor 'layers.0.linear1.weight': data_offsets [0, 12] hold 12 bytes, shape [2, 3] F32 needs 24");
  EXPECT_READ_ERROR("bf16_size.bin", make_file(entry_header("BF16", "[3]", "[0,12]"), twelve),
                    "shape [3] BF16 needs 6");
  EXPECT_READ_ERROR("f16_size.bin", make_file(entry_header("F16", "[]", "[0,12]"), twelve), "shape [] F16 needs 2");
  // numel × size overflows: caught before anything is allocated.
  EXPECT_READ_ERROR("numel_overflow.bin", make_file(entry_header("F32", "[4294967296,4294967296]", "[0,12]"), twelve),
                    "shape [4294967296, 4294967296] F32 is too large");
  EXPECT_READ_ERROR("bytes_overflow.bin", make_file(entry_header("I64", "[4611686018427387904]", "[0,12]"), twelve),
                    "is too large");
  EXPECT_READ_ERROR("wraps_to_12.bin",
                    make_file(entry_header("F32", "[4611686018427387907]", "[0,12]"), twelve), "is too large");
  // A zero size does not excuse the others: Tensor's strides multiply them all.
  EXPECT_READ_ERROR("zero_and_huge.bin",
                    make_file(entry_header("F32", "[0,4294967296,4294967296]", "[0,0]"), ""), "is too large");
}

TEST(SafetensorsMalformed, CoverageOfTheBuffer) {
  const auto tensor = [](const std::string& name, int64_t begin, int64_t end) {
    return "\"" + name + R"(":{"dtype":"BOOL","shape":[)" + std::to_string(end - begin) + R"(],"data_offsets":[)" +
           std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  const auto zeros = [](size_t n) { return std::string(n, '\0'); };
  EXPECT_READ_ERROR("overlap.bin", make_file("{" + tensor("a", 0, 8) + "," + tensor("b", 4, 12) + "}", zeros(12)),
                    "tensor 'b': data_offsets [4, 12] overlap tensor 'a' at [0, 8]");
  EXPECT_READ_ERROR("same_range.bin", make_file("{" + tensor("a", 0, 8) + "," + tensor("b", 0, 8) + "}", zeros(8)),
                    "tensor 'b': data_offsets [0, 8] overlap tensor 'a' at [0, 8]");
  EXPECT_READ_ERROR("empty_inside.bin", make_file("{" + tensor("a", 0, 8) + "," + tensor("z", 4, 4) + "}", zeros(8)),
                    "tensor 'z'", "overlap tensor 'a'");
  EXPECT_READ_ERROR("hole.bin", make_file("{" + tensor("a", 0, 8) + "," + tensor("b", 12, 20) + "}", zeros(20)),
                    "tensor 'b': data_offsets [12, 20] leave buffer bytes [8, 12) unused", "no holes");
  EXPECT_READ_ERROR("hole_first.bin", make_file("{" + tensor("a", 4, 8) + "}", zeros(8)),
                    "leave buffer bytes [0, 4) unused");
  EXPECT_READ_ERROR("trailing.bin", make_file("{" + tensor("a", 0, 8) + "}", zeros(12)),
                    "data buffer bytes [8, 12) after tensor 'a' belong to no tensor");
  EXPECT_READ_ERROR("no_tensors.bin", make_file("{}", zeros(3)),
                    "header lists no tensors but the data buffer holds 3 bytes");
}

TEST(SafetensorsMalformed, BoolBytes) {
  EXPECT_READ_ERROR("bool.bin", make_file(entry_header("BOOL", "[2, 2]", "[0, 4]"), std::string("\1\0\2\1", 4)),
                    "tensor 'w': BOOL element 2 is 2, not 0 or 1");
}

TEST(SafetensorsWriteErrors, NameThePath) {
  const auto message = [](const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata = {}) -> std::string {
    try {
      write_safetensors(path, tensors, metadata);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string nowhere = temp_path("no/such/dir/model.safetensors");
  const std::string m = message(nowhere, {{"w", Tensor::full({1}, 1.0f)}});
  EXPECT_EQ(m.rfind(nowhere + ": cannot create temporary file", 0), 0u) << m;
  EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;

  const std::string path = temp_path("write_errors.safetensors");
  EXPECT_EQ(message(path, {{"__metadata__", Tensor::full({1}, 1.0f)}}),
            path + ": '__metadata__' is reserved and cannot name a tensor");
  EXPECT_EQ(message(path, {{"w", Tensor()}}), path + ": tensor 'w' is undefined");
  Tensor mask = Tensor::zeros({3}, DType::BOOL);
  mask.data<uint8_t>()[2] = 255;
  EXPECT_EQ(message(path, {{"mask", mask}}), path + ": tensor 'mask': BOOL element 2 is 255, not 0 or 1");
  EXPECT_NE(message(path, {{"w\xff", Tensor::full({1}, 1.0f)}}).find(path + ": a tensor name or metadata string is not valid UTF-8"),
            std::string::npos);
  EXPECT_NE(message(path, {}, {{"k", "\xc3"}}).find("not valid UTF-8"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path)) << "a failed write must leave nothing behind";
}

}  // namespace
}  // namespace cabm
