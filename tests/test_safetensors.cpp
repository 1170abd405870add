// safetensors: dtypes, the exact bytes of a small file, round trips of every dtype, slices read through the map
// without touching the rest, atomic replacement, and every kind of bad input with the words of its error.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/checkpoint/safetensors.hpp>
#include <string>
#include <vector>

namespace sw = shardwise;
namespace fs = std::filesystem;

namespace {

/// A fresh directory for one test case, removed afterwards.
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(std::string const& name)
      : path(fs::temp_directory_path() / ("shardwise_test_safetensors_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
  [[nodiscard]] std::string file(std::string const& name) const { return (path / name).string(); }
};

std::string read_all(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_raw(std::string const& path, std::string const& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A file made by hand: the 8-byte little-endian length (or the one given), the header text, the data.
std::string hand_made(std::string const& header, std::string const& data, std::uint64_t length) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xFF);
  return out + header + data;
}
std::string hand_made(std::string const& header, std::string const& data) {
  return hand_made(header, data, header.size());
}

/// Requires that fn throws shardwise::error whose message holds every one of `words`.
template <class Fn>
void check_error(Fn&& fn, std::initializer_list<std::string> words) {
  bool thrown = false;
  try {
    fn();
  } catch (sw::error const& e) {
    thrown = true;
    std::string const message = e.what();
    CHECK_MESSAGE(message.rfind("shardwise::", 0) == 0, message);
    for (auto const& w : words)
      CHECK_MESSAGE(message.find(w) != std::string::npos, "missing \"" << w << "\" in: " << message);
  }
  CHECK_MESSAGE(thrown, "no shardwise::error was thrown");
}

}  // namespace

TEST_CASE("dtype names, sizes and the 16-bit float encodings of IEEE 754 and bfloat16") {
  CHECK(sw::dtype_name(sw::dtype::BF16) == "BF16");
  CHECK(sw::parse_dtype("BOOL") == sw::dtype::BOOL);
  CHECK(!sw::parse_dtype("F8_E4M3").has_value());
  CHECK(!sw::parse_dtype("f32").has_value());
  CHECK(sw::dtype_size(sw::dtype::I64) == 8);
  CHECK(sw::dtype_size(sw::dtype::F16) == 2);
  CHECK(sw::dtype_size(sw::dtype::BOOL) == 1);
  static_assert(sw::dtype_of<float> == sw::dtype::F32 && sw::dtype_of<bool> == sw::dtype::BOOL);
  static_assert(!sw::safetensors_element<long double> && !sw::safetensors_element<char>);

  // binary16 bit patterns from IEEE 754: 1.0, -2.0, 65504 (largest), 2^-14 (smallest normal), 2^-24 (smallest
  // subnormal), infinity.
  CHECK(sw::to_float16(1.0f).bits == 0x3C00);
  CHECK(sw::to_float16(-2.0f).bits == 0xC000);
  CHECK(sw::to_float16(65504.0f).bits == 0x7BFF);
  CHECK(sw::to_float16(0x1p-14f).bits == 0x0400);
  CHECK(sw::to_float16(0x1p-24f).bits == 0x0001);
  CHECK(sw::to_float16(1e6f).bits == 0x7C00);
  CHECK(sw::to_float16(0x1p-26f).bits == 0x0000);               // below half the smallest subnormal
  CHECK(sw::to_float16(0x1.002p0f).bits == 0x3C00);             // 1 + 2^-11 is a tie: to even (1.0)
  CHECK(sw::to_float16(0x1.006p0f).bits == 0x3C02);             // 1 + 3 * 2^-11 is a tie: to even (1 + 2^-9)
  CHECK(sw::to_float16(65520.0f).bits == 0x7C00);               // rounds up past the largest: infinity
  CHECK(sw::to_float(sw::float16{0x3555}) == 0.333251953125f);  // (1 + 341/1024) / 4
  CHECK(sw::to_float(sw::float16{0x0001}) == 0x1p-24f);
  CHECK(sw::to_float(sw::float16{0x03FF}) == 0x1.ff8p-15f);  // largest subnormal: 1023 * 2^-24
  CHECK(sw::to_float(sw::float16{0xFC00}) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(sw::to_float(sw::float16{0x7E00})));
  // bfloat16 is the top half of a float.
  CHECK(sw::to_bfloat16(1.0f).bits == 0x3F80);
  CHECK(sw::to_bfloat16(-3.0f).bits == 0xC040);
  CHECK(sw::to_bfloat16(0x1.01p0f).bits == 0x3F80);  // tie at 1 + 2^-8: to even
  CHECK(sw::to_bfloat16(0x1.03p0f).bits == 0x3F82);  // tie at 1 + 3 * 2^-8: to even
  CHECK(sw::to_float(sw::bfloat16{0x4049}) == 3.140625f);
  CHECK(std::isnan(sw::to_float(sw::to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("the bytes of a small file, as the format specifies them") {
  scratch_dir dir("bytes");
  std::vector<float> const a{1.0f, 2.0f};
  std::vector<std::uint8_t> const b{7};
  sw::safetensors_writer out;
  out.add<std::uint8_t>("b", {1}, b);
  out.add<float>("a", {2}, a);
  out.write(dir.file("x.safetensors"), {{"format", "pt"}});
  // Sorted keys, the data ordered by element size (a before b), header padded with spaces to a multiple of 8.
  std::string const header = R"({"__metadata__":{"format":"pt"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},)"
                             R"("b":{"data_offsets":[8,9],"dtype":"U8","shape":[1]}})";
  std::string const padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::string const data("\x00\x00\x80\x3f\x00\x00\x00\x40\x07", 9);
  CHECK(read_all(dir.file("x.safetensors")) == hand_made(padded, data));
  // No temporary file is left beside it.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("every dtype and the metadata round-trip") {
  scratch_dir dir("roundtrip");
  std::vector<double> const f64{1.5, -2.25, 1e300, 0.0, -0.0, 3.0};
  std::vector<float> const f32{1.5f, -2.25f, 3.0f, 1e-30f};
  std::vector<sw::float16> const f16{{0x3C00}, {0xC000}, {0x7BFF}, {0x0001}};
  std::vector<sw::bfloat16> const bf16{{0x3F80}, {0xC040}};
  std::vector<std::int64_t> const i64{std::numeric_limits<std::int64_t>::min(), -1, 0, 1,
                                      std::numeric_limits<std::int64_t>::max(), 42};
  std::vector<std::int32_t> const i32{-7, 0, 2147483647};
  std::vector<std::uint8_t> const u8{0, 1, 255};
  bool const flags[] = {true, false, false, true};
  std::vector<float> const scalar{6.5f};
  sw::safetensors_writer out;
  out.add<double>("f64", {2, 3}, f64);
  out.add<float>("f32", {2, 2}, f32);
  out.add<sw::float16>("f16", {4}, f16);
  out.add<sw::bfloat16>("bf16", {1, 2}, bf16);
  out.add<std::int64_t>("i64", {3, 2}, i64);
  out.add<std::int32_t>("i32", {3}, i32);
  out.add<std::uint8_t>("u8", {3}, u8);
  out.add<bool>("bool", {2, 2}, std::span<bool const>(flags));
  out.add<float>("scalar", {}, scalar);
  out.add<float>("empty", {0, 5}, std::span<float const>());
  std::string const path = dir.file("all.safetensors");
  out.write(path, {{"format", "pt"}, {"step", "12"}, {"note", "ünïcode ✓"}});

  sw::safetensors_file in(path);
  CHECK(in.tensors().size() == 10);
  CHECK(in.metadata().size() == 3);
  CHECK(in.metadata().at("step") == "12");
  CHECK(in.metadata().at("note") == "ünïcode ✓");
  CHECK(in.read<double>("f64") == f64);
  CHECK(in.read<float>("f32") == f32);
  auto const h = in.read<sw::float16>("f16");
  REQUIRE(h.size() == 4);
  CHECK((h[0].bits == 0x3C00 && h[1].bits == 0xC000 && h[2].bits == 0x7BFF && h[3].bits == 0x0001));
  CHECK(in.read<float>("f16") == std::vector<float>{1.0f, -2.0f, 65504.0f, 0x1p-24f});  // converted on reading
  CHECK(in.read<double>("bf16") == std::vector<double>{1.0, -3.0});
  CHECK(in.read<double>("f32") == std::vector<double>{1.5, -2.25, 3.0, static_cast<double>(1e-30f)});
  CHECK(in.read<std::int64_t>("i64") == i64);
  CHECK(in.read<std::int32_t>("i32") == i32);
  CHECK(in.read<std::uint8_t>("u8") == u8);
  CHECK(in.read<bool>("bool") == std::vector<bool>{true, false, false, true});
  CHECK(in.info("scalar").shape.empty());
  CHECK(in.read<float>("scalar") == scalar);
  CHECK(in.read<float>("empty").empty());
  CHECK(in.info("i64").shape == std::vector<std::uint64_t>{3, 2});
  CHECK(in.info("bf16").type == sw::dtype::BF16);
  // Every tensor starts aligned to its element size (data ordered by element size, header padded to 8).
  std::string const bytes = read_all(path);
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  CHECK(header_length % 8 == 0);
  for (auto const& t : in.tensors()) CHECK(t.begin % sw::dtype_size(t.type) == 0);
}

TEST_CASE("Eigen matrices in and out, row-major and column-major, whole and in slices") {
  scratch_dir dir("eigen");
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMatrix w(6, 5);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j) w(i, j) = static_cast<float>(10 * i + j);
  Eigen::MatrixXd col = w.cast<double>();  // column-major storage
  Eigen::VectorXf bias(3);
  bias << 1.0f, 2.0f, 3.0f;
  sw::safetensors_writer out;
  out.add("w", w);
  out.add("col", col);
  out.add("bias", bias);
  std::string const path = dir.file("eigen.safetensors");
  out.write(path);

  sw::safetensors_file in(path);
  CHECK(in.metadata().empty());
  CHECK(in.shape("w") == sw::extents{6, 5});
  CHECK(in.shape("col") == sw::extents{6, 5});  // written row-major whatever the storage
  std::vector<double> const col_values = in.read<double>("col");
  for (std::size_t k = 0; k < col_values.size(); ++k) CHECK(col_values[k] == static_cast<double>(10 * (k / 5) + k % 5));
  CHECK(in.load<RowMatrix>("w") == w);
  CHECK(in.load<Eigen::MatrixXf>("w") == w);  // into column-major storage
  CHECK(in.load<Eigen::MatrixXd>("col") == col);
  CHECK(in.load<Eigen::VectorXf>("bias") == bias);
  CHECK(in.load<Eigen::MatrixXd>("w") == w.cast<double>());  // F32 read as double

  // Rows 2..4 and a box of rows 1..3 x columns 2..4: expected values from the formula above.
  std::vector<float> rows(3 * 5);
  in.read_rows("w", 2, 3, rows.data());
  for (std::size_t k = 0; k < rows.size(); ++k) CHECK(rows[k] == static_cast<float>(10 * (2 + k / 5) + k % 5));
  RowMatrix box = in.load_box<RowMatrix>("w", {1, 2}, {3, 3});
  Eigen::MatrixXf box_col = in.load_box<Eigen::MatrixXf>("w", {1, 2}, {3, 3});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      CHECK(box(i, j) == static_cast<float>(10 * (1 + i) + 2 + j));
      CHECK(box_col(i, j) == static_cast<float>(10 * (1 + i) + 2 + j));
    }
  Eigen::MatrixXf into(2, 5);
  in.load_box_into("w", {4, 0}, into);
  CHECK(into == w.bottomRows(2));
  Eigen::MatrixXf wrong(7, 5);
  check_error([&] { in.load_into("w", wrong); }, {path, "\"w\"", "goes beyond it in dimension 0"});
  check_error([&] { (void)in.load_box<RowMatrix>("w", {5, 0}, {2, 5}); }, {path, "\"w\"", "ask for a box inside"});
  check_error([&] { (void)in.load<Eigen::VectorXf>("w"); }, {path, "\"w\"", "the destination has rank 1"});
  check_error([&] { (void)in.read<std::int32_t>("w"); }, {path, "\"w\"", "stored as F32 and cannot be read as I32"});
  check_error([&] { (void)in.read<float>("missing"); }, {path, "\"missing\"", "is not in the file", "\"bias\""});
}

TEST_CASE("a slice is read without touching the rest of the file") {
  // 8 MiB of rows; after dropping the file from the page cache, reading 64 KiB from the middle must leave the
  // first and last 2 MiB uncached (the kernel reads ahead a little around a fault, not megabytes).
  fs::path const path = fs::current_path() / ("shardwise_test_slice_" + std::to_string(::getpid()) + ".safetensors");
  std::size_t const rows = 2048, cols = 1024;
  std::vector<float> big(rows * cols);
  for (std::size_t k = 0; k < big.size(); ++k) big[k] = static_cast<float>(k % 1000);
  sw::safetensors_writer out;
  out.add<float>("big", {rows, cols}, big);
  out.write(path);
  big.clear();
  big.shrink_to_fit();

  auto const cached_pages = [&](std::size_t from, std::size_t to) {
    int const fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    std::size_t const size = fs::file_size(path);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(map != MAP_FAILED);
    std::size_t const page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> resident((size + page - 1) / page);
    REQUIRE(::mincore(map, size, resident.data()) == 0);
    std::size_t count = 0;
    for (std::size_t p = from / page; p < to / page && p < resident.size(); ++p) count += resident[p] & 1;
    ::munmap(map, size);
    ::close(fd);
    return count;
  };
  {
    int const fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    ::close(fd);
  }
  std::size_t const mib = std::size_t{1} << 20;
  std::size_t const file_size = fs::file_size(path);
  REQUIRE(cached_pages(0, file_size) == 0);  // the precondition: nothing cached

  sw::safetensors_file in(path.string());
  std::vector<float> slice(16 * cols);
  in.read_rows("big", 1024, 16, slice.data());
  for (std::size_t k = 0; k < slice.size(); ++k) CHECK(slice[k] == static_cast<float>((1024 * cols + k) % 1000));
  CHECK(cached_pages(4 * mib + 8192, 4 * mib + 64 * 1024) > 0);  // the slice itself was read
  CHECK(cached_pages(8192, 2 * mib) == 0);
  CHECK(cached_pages(file_size - 2 * mib, file_size) == 0);
  fs::remove(path);
}

TEST_CASE("writing replaces the file atomically") {
  scratch_dir dir("atomic");
  std::string const path = dir.file("m.safetensors");
  std::vector<float> const first{1, 2, 3};
  std::vector<float> const second{4, 5};
  sw::safetensors_writer a;
  a.add<float>("t", {3}, first);
  a.write(path);
  sw::safetensors_file before(path);  // mapped: the rename must not change what this reader sees
  sw::safetensors_writer b;
  b.add<float>("t", {2}, second);
  b.write(path, {{"v", "2"}});
  CHECK(before.read<float>("t") == first);
  CHECK(sw::safetensors_file(path).read<float>("t") == second);
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);

  // A directory that does not exist: an error naming the file, and nothing written.
  check_error([&] { b.write(dir.file("no/such/dir/m.safetensors")); }, {"no/such/dir/m.safetensors", "temporary file"});
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("the writer refuses what would make a bad file") {
  std::vector<float> const v{1, 2, 3};
  sw::safetensors_writer out;
  out.add<float>("t", {3}, v);
  check_error([&] { out.add<float>("t", {3}, v); }, {"\"t\"", "added twice"});
  check_error([&] { out.add<float>("__metadata__", {3}, v); }, {"\"__metadata__\"", "reserved"});
  check_error([&] { out.add<float>("u", {2, 2}, v); }, {"\"u\"", "needs 16 bytes but 12 were given"});
  check_error([&] { out.add<float>("huge", {1ull << 40, 1ull << 40}, v); }, {"\"huge\"", "more than 2^64"});
}

TEST_CASE("bad files: an error naming the file, the tensor and the fix, never a crash") {
  scratch_dir dir("bad");
  auto const open = [&](std::string const& name, std::string const& bytes) {
    std::string const path = dir.file(name);
    write_raw(path, bytes);
    return [path] { sw::safetensors_file f(path); };
  };
  std::string const f32x2 = std::string(8, '\x01');  // two F32 values

  SUBCASE("truncated below the length field") {
    check_error(open("short.safetensors", std::string("\x10\x00\x00", 3)),
                {"short.safetensors", "3 bytes", "shorter than the 8-byte"});
    check_error(open("empty.safetensors", ""), {"empty.safetensors", "0 bytes"});
  }
  SUBCASE("truncated data") {
    auto const file = hand_made(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32x2);
    check_error(open("cut.safetensors", file),
                {"cut.safetensors", "tensor \"w\"", "go beyond the 8 data bytes", "truncated"});
  }
  SUBCASE("header length beyond the file") {
    std::string const header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    check_error(open("long.safetensors", hand_made(header, f32x2, header.size() + 100)),
                {"long.safetensors", "header length", "goes beyond the end of the file", "truncated"});
  }
  SUBCASE("a hostile header length: no allocation, no read") {
    check_error(open("huge.safetensors", hand_made("{}", "", std::uint64_t{1} << 62)),
                {"huge.safetensors", "above the limit of 100000000"});
    check_error(open("max.safetensors", hand_made("{}", "", ~std::uint64_t{0})),
                {"max.safetensors", "above the limit"});
    check_error(open("almost.safetensors", hand_made("{}", "", 99'999'999)),
                {"almost.safetensors", "goes beyond the end"});
  }
  SUBCASE("a hostile shape: sizes that overflow or do not match the bytes") {
    check_error(
        open("shape.safetensors",
             hand_made(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", f32x2)),
        {"shape.safetensors", "tensor \"w\"", "more than 2^64"});
    check_error(
        open("count.safetensors", hand_made(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2)),
        {"count.safetensors", "tensor \"w\"", "needs 12 bytes, but data_offsets [0, 8] hold 8"});
    check_error(open("neg.safetensors", hand_made(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2)),
                {"neg.safetensors", "tensor \"w\"", "shape holds -2"});
    check_error(open("deep.safetensors", hand_made(std::string(200000, '[') + std::string(200000, ']'), "")),
                {"deep.safetensors", "nests JSON deeper"});
  }
  SUBCASE("not JSON") {
    check_error(open("text.safetensors", hand_made("{\"w\": {\"dtype\": \"F32\",", f32x2)),
                {"text.safetensors", "not valid JSON"});
    check_error(open("binary.safetensors", hand_made(std::string("\xff\xfe\x00\x01", 4), "")),
                {"binary.safetensors", "not valid JSON"});
    check_error(open("array.safetensors", hand_made("[1, 2]", "")), {"array.safetensors", "not an object of tensors"});
  }
  SUBCASE("overlapping, reversed and out-of-range offsets, holes and trailing bytes") {
    std::string const two = std::string(16, '\x02');
    check_error(open("overlap.safetensors", hand_made(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                                                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                                      two)),
                {"overlap.safetensors", "tensor \"b\"", "overlap those of tensor \"a\""});
    check_error(
        open("range.safetensors", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", two)),
        {"range.safetensors", "tensor \"a\"", "go beyond the 16 data bytes"});
    check_error(
        open("reversed.safetensors", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", two)),
        {"reversed.safetensors", "tensor \"a\"", "end before they begin"});
    check_error(open("hole.safetensors", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", two)),
                {"hole.safetensors", "tensor \"a\"", "leave bytes 0..8"});
    check_error(open("tail.safetensors", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", two)),
                {"tail.safetensors", "tensor \"a\"", "bytes no tensor uses"});
    check_error(open("offsets.safetensors", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", two)),
                {"offsets.safetensors", "tensor \"a\"", "not [begin, end]"});
  }
  SUBCASE("unknown dtype, missing fields, bad metadata") {
    check_error(
        open("dtype.safetensors", hand_made(R"({"fp8":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", f32x2)),
        {"dtype.safetensors", "tensor \"fp8\"", "dtype \"F8_E4M3\" is not one shardwise reads", "convert"});
    check_error(open("lacks.safetensors", hand_made(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", f32x2)),
                {"lacks.safetensors", "tensor \"w\"", "lacks shape"});
    check_error(
        open("meta.safetensors",
             hand_made(R"({"__metadata__":{"step":12},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2)),
        {"meta.safetensors", "__metadata__ value of \"step\"", "not a string"});
  }
  SUBCASE("a FIFO in place of the file is refused, not waited on") {
    std::string const fifo = dir.file("fifo.safetensors");
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    check_error([&] { sw::safetensors_file f(fifo); }, {"fifo.safetensors", "is not a regular file"});
  }
  SUBCASE("deep nesting in a tensor's entry is refused before parsing, wherever it is") {
    check_error(
        open("deep_shape.safetensors", hand_made(R"({"w":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", f32x2)),
        {"deep_shape.safetensors", "nests JSON deeper"});
    // brackets inside a string are not nesting
    sw::safetensors_file f(
        (write_raw(dir.file("string.safetensors"), hand_made(R"({"__metadata__":{"k":"[[[[{{{{"},)"
                                                             R"("w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
                                                             f32x2)),
         dir.file("string.safetensors")));
    CHECK(f.metadata().at("k") == "[[[[{{{{");
  }
  SUBCASE("a good hand-made file with spaces after the header is accepted") {
    sw::safetensors_file f(
        (write_raw(dir.file("good.safetensors"),
                   hand_made(R"({"w":{"dtype":"U8","shape":[2,4],"data_offsets":[0,8]}}   )", f32x2)),
         dir.file("good.safetensors")));
    CHECK(f.read<std::uint8_t>("w") == std::vector<std::uint8_t>(8, 1));
  }
}

// Whether sanitizers or a build without optimization slow this binary (g++ says so by __SANITIZE_*__, clang by
// __has_feature).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__OPTIMIZE__)
constexpr bool slowed_build = true;
#elif defined(__has_feature)
constexpr bool slowed_build = __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);
#else
constexpr bool slowed_build = false;
#endif

TEST_CASE("a header of 100,000 tensors is read in time linear in its size (a guard against quadratic parsing)") {
  // 40,000 tensors took 92 s when a depth-limiting callback made the parser rescan; linear parsing takes about
  // 0.4 s here (-O2). The bound is 1 s in an optimized build (the fastest of three reads) and 30 s under the
  // sanitizers, which slow the parse tenfold; a quadratic parse would take about ten minutes.
  scratch_dir dir("many");
  constexpr std::size_t tensors = 100'000;
  std::string header = "{";
  for (std::size_t i = 0; i < tensors; ++i)
    header += (i ? "," : "") + std::string("\"t") + std::to_string(i) +
              "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + std::to_string(i) + "," +
              std::to_string(i + 1) + "]}";
  header += "}";
  write_raw(dir.file("many.safetensors"), hand_made(header, std::string(tensors, '\x07')));
  double fastest = 1e9;
  for (int round = 0; round < 3; ++round) {
    auto const start = std::chrono::steady_clock::now();
    sw::safetensors_file f(dir.file("many.safetensors"));
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    CHECK(f.tensors().size() == tensors);
    CHECK(f.read<std::uint8_t>("t99999") == std::vector<std::uint8_t>{7});
  }
  double const bound = slowed_build ? 30.0 : 1.0;
  CHECK_MESSAGE(fastest < bound, "the fastest of three reads took " << fastest << " s");
}
