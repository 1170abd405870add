// The shardwise half of the outside check with Hugging Face's safetensors (tests/torch/safetensors_reference.py):
//   safetensors_check write DIR   writes DIR/from_shardwise.safetensors: every dtype, with metadata
//   safetensors_check read DIR    reads DIR/from_python.safetensors and DIR/from_python_bf16.safetensors (written
//                                 by safetensors' numpy and torch APIs) and checks every value
// Both sides compute the values from the same simple formulas (inputs, not results); every check prints
// "ok NAME" or "FAIL NAME: why".
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <shardwise/checkpoint/safetensors.hpp>
#include <string>
#include <vector>

namespace sw = shardwise;

namespace {

// The formulas, also in safetensors_reference.py: exact in every floating type used.
double value(std::size_t k) { return (static_cast<double>((k * 7) % 13) - 6.0) * 0.25; }
std::uint8_t byte_value(std::size_t k) { return static_cast<std::uint8_t>((k * 37) % 256); }
bool flag(std::size_t k) { return k % 3 == 0; }
std::vector<std::int64_t> const i64_values{std::numeric_limits<std::int64_t>::min(), -1,           0, 1,
                                           std::numeric_limits<std::int64_t>::max(), 1234567890123};
std::vector<std::int32_t> const i32_values{std::numeric_limits<std::int32_t>::min(), -5, 7,
                                           std::numeric_limits<std::int32_t>::max()};

int failures = 0;
void report(std::string const& name, bool ok, std::string const& why = "") {
  if (ok)
    std::printf("ok %s\n", name.c_str());
  else
    std::printf("FAIL %s: %s\n", name.c_str(), why.c_str());
  failures += ok ? 0 : 1;
}

template <class T>
std::vector<T> formula(std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t k = 0; k < n; ++k) v[k] = static_cast<T>(value(k));
  return v;
}

void write(std::string const& dir) {
  auto const f64 = formula<double>(12);
  auto const f32 = formula<float>(12);
  std::vector<sw::float16> f16(15);
  for (std::size_t k = 0; k < f16.size(); ++k) f16[k] = sw::to_float16(static_cast<float>(value(k)));
  std::vector<sw::bfloat16> bf16(8);
  for (std::size_t k = 0; k < bf16.size(); ++k) bf16[k] = sw::to_bfloat16(static_cast<float>(value(k)));
  std::vector<std::uint8_t> u8(7);
  for (std::size_t k = 0; k < u8.size(); ++k) u8[k] = byte_value(k);
  bool flags[9];
  for (std::size_t k = 0; k < 9; ++k) flags[k] = flag(k);
  // binary16 specials: smallest subnormal, largest finite, infinities, negative zero.
  std::vector<sw::float16> const special{{0x0001}, {0x7BFF}, {0x7C00}, {0xFC00}, {0x8000}};
  std::vector<float> const scalar{2.5f};
  sw::safetensors_writer out;
  out.add<double>("f64", {3, 4}, f64);
  out.add<float>("f32", {2, 3, 2}, f32);
  out.add<sw::float16>("f16", {5, 3}, f16);
  out.add<sw::bfloat16>("bf16", {4, 2}, bf16);
  out.add<std::int64_t>("i64", {6}, i64_values);
  out.add<std::int32_t>("i32", {2, 2}, i32_values);
  out.add<std::uint8_t>("u8", {7}, u8);
  out.add<bool>("bool", {3, 3}, std::span<bool const>(flags));
  out.add<sw::float16>("f16_special", {5}, special);
  out.add<float>("scalar", {}, scalar);
  out.add<float>("empty", {0, 3}, std::span<float const>());
  out.write(dir + "/from_shardwise.safetensors", {{"producer", "shardwise"}, {"format", "pt"}});
  std::printf("wrote %s/from_shardwise.safetensors\n", dir.c_str());
}

template <class T>
void check_values(sw::safetensors_file const& f, std::string const& name, std::vector<std::uint64_t> const& shape,
                  std::vector<T> const& expected) {
  std::string const what = f.path() + ":" + name;
  try {
    if (f.info(name).shape != shape) return report(what, false, "shape differs");
    auto const got = f.template read<T>(name);
    if (got.size() != expected.size()) return report(what, false, "element count differs");
    for (std::size_t k = 0; k < got.size(); ++k)
      if (!(got[k] == expected[k]) ||
          std::signbit(static_cast<double>(got[k])) != std::signbit(static_cast<double>(expected[k])))
        return report(what, false, "element " + std::to_string(k) + " differs");
    report(what, true);
  } catch (std::exception const& e) {
    report(what, false, e.what());
  }
}

void read(std::string const& dir) {
  sw::safetensors_file f(dir + "/from_python.safetensors");
  report("metadata", f.metadata().size() == 2 && f.metadata().at("producer") == "safetensors.numpy" &&
                         f.metadata().at("format") == "np");
  check_values(f, "f64", {3, 4}, formula<double>(12));
  check_values(f, "f32", {2, 3, 2}, formula<float>(12));
  check_values(f, "f16", {5, 3}, formula<float>(15));  // F16 read as float
  check_values(f, "i64", {6}, i64_values);
  check_values(f, "i32", {2, 2}, i32_values);
  std::vector<std::uint8_t> u8(7);
  for (std::size_t k = 0; k < u8.size(); ++k) u8[k] = byte_value(k);
  check_values(f, "u8", {7}, u8);
  std::vector<bool> flags(9);
  for (std::size_t k = 0; k < flags.size(); ++k) flags[k] = flag(k);
  try {
    report("bool", f.info("bool").shape == std::vector<std::uint64_t>{3, 3} && f.read<bool>("bool") == flags);
  } catch (std::exception const& e) {
    report("bool", false, e.what());
  }
  float const inf = std::numeric_limits<float>::infinity();
  check_values(f, "f16_special", {5}, std::vector<float>{0x1p-24f, 65504.0f, inf, -inf, -0.0f});
  check_values(f, "scalar", {}, std::vector<float>{2.5f});
  check_values(f, "empty", {0, 3}, std::vector<float>{});
  // A slice: rows 1..2 of f64 (shape 3 x 4).
  std::vector<double> rows(8);
  f.read_rows("f64", 1, 2, rows.data());
  bool rows_ok = true;
  for (std::size_t k = 0; k < rows.size(); ++k) rows_ok = rows_ok && rows[k] == value(4 + k);
  report("f64 rows 1..2", rows_ok);

  sw::safetensors_file g(dir + "/from_python_bf16.safetensors");
  check_values(g, "bf16", {4, 2}, formula<double>(8));
  report("bf16 metadata", g.metadata().size() == 1 && g.metadata().at("producer") == "safetensors.torch");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s write|read DIR\n", argv[0]);
    return 2;
  }
  std::string const mode = argv[1], dir = argv[2];
  try {
    if (mode == "write")
      write(dir);
    else
      read(dir);
  } catch (std::exception const& e) {
    report(mode, false, e.what());
  }
  return failures ? 1 : 0;
}
