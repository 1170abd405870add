#pragma once
// Machine files for the planner (`shardwise plan --machine FILE`): a JSON description of one rank's GEMM rate and
// memory bandwidth and of each mesh axis' link, read into planner::machine. Parsed with nlohmann::json.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "shardwise/core/bounded_json.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/core/read_file.hpp"
#include "shardwise/planner/planning.hpp"

namespace shardwise::planner {

namespace detail {
/// What a machine file may say for one field: a number from `least` to `most` (so never inf or NaN).
struct machine_range {
  double least;      ///< The smallest value accepted.
  double most;       ///< The largest value accepted.
  char const* what;  ///< The quantity, for the error.
  char const* unit;  ///< Its unit, for the error.
};
inline constexpr machine_range gemm_flops_range{1e3, 1e18, "a rank's GEMM rate", "FLOP/s"};
inline constexpr machine_range memory_bandwidth_range{1e3, 1e15, "a rank's memory bandwidth", "bytes/s"};
inline constexpr machine_range link_bandwidth_range{1e3, 1e15, "a link's bandwidth", "bytes/s"};
inline constexpr machine_range latency_range{1e-9, 60, "a link's latency", "seconds"};
// 0: a GEMM rate flat in the tokens.
inline constexpr machine_range half_rate_tokens_range{0, 1e9, "the tokens at half the GEMM rate", "tokens"};
}  // namespace detail

/// The machine described by the text of a JSON file (`file` names it in errors): {"name", "measured", "gemm_flops",
/// "gemm_half_rate_tokens", "memory_bandwidth", "ranks_per_node", "tp": {"bandwidth", "latency"}, "dp": {...}, "pp":
/// {...}}; a field left out keeps this machine's measured value.
inline machine machine_from_json(std::string_view text, std::filesystem::path const& file) {
  constexpr char const* who = "shardwise::planner::read_machine";
  nlohmann::json const root = shardwise::detail::parse_bounded_json(
      text, shardwise::detail::max_json_depth,
      [&](std::size_t depth) {
        shardwise::raise(who, ": ", file.string(), " nests JSON ", depth,
                         " deep; a machine file is an object of rates (see tools/machines/this_machine.json)");
      },
      [&](std::string const& reason) {
        shardwise::raise(who, ": ", file.string(), " is not valid JSON (", reason,
                         "); see tools/machines/this_machine.json for the format");
      });
  machine m;
  auto const object = [&](nlohmann::json const& at, std::string_view what) {
    if (!at.is_object())
      shardwise::raise(who, ": ", what, " in ", file.string(), " is a JSON ", at.type_name(),
                       ", not an object of rates; see tools/machines/this_machine.json for the format");
  };
  object(root, "the file");
  // Each value within what a real machine has, so an impossible file (1e-300 FLOP/s plans an infinite step, 1e300 a
  // free one) is refused instead of planning at inf or 0 tokens/s. The ranges (docs/planning.md) are generous: from
  // a slow embedded core to hundreds of times any rank built so far.
  auto const number = [&](nlohmann::json const& at, char const* field, double& into, detail::machine_range range) {
    if (!at.contains(field)) return;
    double const value = at[field].is_number() ? at[field].get<double>() : -1;
    if (!(value >= range.least && value <= range.most))
      shardwise::raise(who, ": \"", field, "\" in ", file.string(), " is ", at[field].dump(), "; ", range.what,
                       " must be a number from ", range.least, " to ", range.most, " ", range.unit,
                       "; measure this machine with bench_machine (build/bench/bench_machine > my_machine.json) or "
                       "correct the file");
    into = value;
  };
  if (root.contains("name") && root["name"].is_string()) m.name = root["name"].get<std::string>();
  m.measured.clear();  // the built-in default's date is not the file's
  if (root.contains("measured") && root["measured"].is_string())
    m.measured = root["measured"].get<std::string>().substr(0, 64);
  if (root.contains("ranks_per_node")) {
    if (!root["ranks_per_node"].is_number_unsigned())
      shardwise::raise(who, ": \"ranks_per_node\" in ", file.string(),
                       " must be a whole number (0: every rank on one node)");
    m.ranks_per_node = root["ranks_per_node"].get<std::size_t>();
  }
  number(root, "gemm_flops", m.gemm_flops, detail::gemm_flops_range);
  number(root, "memory_bandwidth", m.memory_bandwidth, detail::memory_bandwidth_range);
  number(root, "gemm_half_rate_tokens", m.gemm_half_rate_tokens, detail::half_rate_tokens_range);
  for (auto [axis, into] : {std::pair{"tp", &m.tp}, std::pair{"dp", &m.dp}, std::pair{"pp", &m.pp}})
    if (root.contains(axis)) {
      object(root[axis], std::string("\"") + axis + "\"");
      number(root[axis], "bandwidth", into->bandwidth, detail::link_bandwidth_range);
      number(root[axis], "latency", into->latency, detail::latency_range);
    }
  return m;
}

/// The machine described by the JSON file `file` (see machine_from_json).
inline machine read_machine(std::filesystem::path const& file) {
  return machine_from_json(
      shardwise::detail::read_regular_file(file.string(), "shardwise::planner::read_machine", "give a machine file"),
      file);
}

}  // namespace shardwise::planner
