// The time to parse a safetensors header of N tensors (default 100,000): a guard that parsing stays linear in the
// header (docs/benchmarks.md, "Hostile files"). Prints the fastest of three parses.
//   bench_header_parse [TENSORS]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <shardwise/checkpoint/safetensors_header.hpp>
#include <span>
#include <string>

int main(int argc, char** argv) {
  std::size_t const n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 100'000;
  std::string header = "{";
  for (std::size_t i = 0; i < n; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"U8","shape":[1],"data_offsets":[)" +
              std::to_string(i) + "," + std::to_string(i + 1) + "]}";
  header += "}";
  std::string file(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  file += header + std::string(n, '\7');
  std::span<std::byte const> const bytes(reinterpret_cast<std::byte const*>(file.data()), file.size());
  double fastest = 1e9;
  std::size_t parsed = 0;
  for (int round = 0; round < 3; ++round) {
    auto const start = std::chrono::steady_clock::now();
    parsed = shardwise::parse_safetensors_header(bytes, "bench.safetensors").tensors.size();
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("RESULT tensors=%zu header_bytes=%zu seconds=%.3f\n", parsed, header.size(), fastest);
  return parsed == n ? 0 : 1;
}
