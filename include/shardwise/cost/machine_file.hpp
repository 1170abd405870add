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
#include "shardwise/cost/planning.hpp"

namespace shardwise::planner {

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
  // Each rate within what any machine could have (a rank of 10 EFLOP/s, 10 PB/s, a latency of a minute), so an
  // absurd file is refused instead of planning at inf or 0 tokens/s.
  auto const number = [&](nlohmann::json const& at, char const* field, double& into, double most,
                          bool zero_allowed = false) {
    if (!at.contains(field)) return;
    double const value = at[field].is_number() ? at[field].get<double>() : -1;
    if (!(value > 0 || (zero_allowed && value == 0)) || !(value <= most))
      shardwise::raise(who, ": \"", field, "\" in ", file.string(), " must be a number ",
                       zero_allowed ? "from 0" : "above 0", " up to ", most, "; it is ", at[field].dump());
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
  number(root, "gemm_flops", m.gemm_flops, 1e19), number(root, "memory_bandwidth", m.memory_bandwidth, 1e16);
  number(root, "gemm_half_rate_tokens", m.gemm_half_rate_tokens, 1e9, true);  // 0: a rate flat in the tokens
  for (auto [axis, into] : {std::pair{"tp", &m.tp}, std::pair{"dp", &m.dp}, std::pair{"pp", &m.pp}})
    if (root.contains(axis)) {
      object(root[axis], std::string("\"") + axis + "\"");
      number(root[axis], "bandwidth", into->bandwidth, 1e16), number(root[axis], "latency", into->latency, 60);
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
