// One libFuzzer binary for every reader of outside input; SHARDWISE_FUZZ_TARGET names the one a run fuzzes
// (scripts/fuzz.sh). One binary parses the library, nlohmann::json and Eigen once: five took 110 s to build.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "checkpoint_index.hpp"
#include "llama_config.hpp"
#include "machine_file.hpp"
#include "peft_config.hpp"
#include "pretrained_index.hpp"
#include "safetensors_header.hpp"

namespace {
using reader = void (*)(std::uint8_t const*, std::size_t);
reader fuzzed = nullptr;

struct named_reader {
  std::string_view name;
  reader run;
};
constexpr named_reader readers[] = {
    {"safetensors_header", fuzz_readers::safetensors_header},
    {"checkpoint_index", fuzz_readers::checkpoint_index},
    {"pretrained_index", fuzz_readers::pretrained_index},
    {"llama_config", fuzz_readers::llama_config},
    {"machine_file", fuzz_readers::machine_file},
    {"peft_config", fuzz_readers::peft_config},
};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char const* const wanted = std::getenv("SHARDWISE_FUZZ_TARGET");
  for (auto const& r : readers)
    if (wanted != nullptr && r.name == wanted) fuzzed = r.run;
  if (fuzzed == nullptr) {
    std::fprintf(stderr, "readers_fuzz: set SHARDWISE_FUZZ_TARGET to one of:");
    for (auto const& r : readers) std::fprintf(stderr, " %.*s", static_cast<int>(r.name.size()), r.name.data());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  fuzzed(data, size);
  return 0;
}
