// shardwise: the checkpoint command line.
//   shardwise consolidate CHECKPOINT_DIR OUTPUT_DIR [--remove-checkpoint-dir]
//       [--names shardwise|transformers-llama|transformers-qwen2|transformers-qwen3|transformers-mistral|
//        transformers-gpt2]
//   shardwise inspect FILE_OR_DIR
//   shardwise verify CHECKPOINT_DIR_OR_FILE
//   shardwise plan CONFIG.json --ranks N --memory-per-rank BYTES [--machine FILE]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <shardwise/checkpoint/atomic_file.hpp>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/file_checks.hpp>
#include <shardwise/checkpoint/safetensors.hpp>
#include <shardwise/checkpoint/sharded_index.hpp>
#include <shardwise/checkpoint/verify.hpp>
#include <shardwise/models/gpt2_config_json.hpp>
#include <shardwise/models/gpt2_names.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>

#include "plan_command.hpp"

namespace sw = shardwise;
namespace fs = std::filesystem;

namespace {

std::string human_bytes(std::uint64_t n) {
  char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  std::ostringstream out;
  out.precision(u ? 1 : 0);
  out << std::fixed << v << ' ' << units[u];
  return out.str();
}

/// The number a checkpoint's configuration records for `field`; throws naming the field when it has none.
double config_field(sw::checkpoint_index const& index, char const* field, char const* names) {
  auto const found = index.config.find(field);
  double value = 0;
  if (found != index.config.end()) {
    auto const& text = found->second;
    auto const [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error == std::errc() && end == text.data() + text.size() && std::isfinite(value) && value > 0) return value;
  }
  throw std::runtime_error(std::string("shardwise consolidate --names ") + names +
                           ": the checkpoint's configuration has no positive number \"" + field +
                           "\", which config.json needs; save it from the model's own class, or consolidate with "
                           "--names shardwise");
}

/// transformers' config.json for the model saved at `index` under `names` (transformers-llama or -gpt2), so that
/// from_pretrained(OUTPUT_DIR) loads it. GPT-2's n_positions is wpe's rows; a Llama's max_position_embeddings is
/// not recorded (transformers' default applies: the plain rotary embedding does not depend on it), but for a
/// llama3 or yarn scaling it is the scaled context, original_max_position_embeddings x factor, which transformers
/// checks against the original.
nlohmann::json transformers_config(sw::checkpoint_index const& index, std::string const& names) {
  auto const count = [&](char const* field) {
    return static_cast<std::size_t>(config_field(index, field, names.c_str()));
  };
  auto const count_or_zero = [&](char const* field) {
    auto const found = index.config.find(field);
    return found == index.config.end() || found->second == "0" ? std::size_t{0} : count(field);
  };
  if (names == "transformers-gpt2") {
    sw::models::GPT2Config c;
    c.vocabulary = count("vocabulary"), c.dim = count("dim"), c.layers = count("layers"), c.heads = count("heads");
    c.layer_norm_eps = config_field(index, "layer_norm_eps", names.c_str());
    auto const wpe =
        std::find_if(index.tensors.begin(), index.tensors.end(), [](auto const& t) { return t.name == "wpe.weight"; });
    if (wpe == index.tensors.end() || wpe->shape.size() != 2)
      throw std::runtime_error(
          "shardwise consolidate --names transformers-gpt2: the checkpoint has no wpe.weight "
          "matrix, so it is not a models::GPT2; consolidate it with --names shardwise");
    c.sequence = static_cast<std::size_t>(wpe->shape[0]);
    return sw::models::gpt2_config_to_json(c);
  }
  if (index.config.contains("experts"))  // its routing (top-k, renormalisation) is not among the recorded fields
    throw std::runtime_error("shardwise consolidate --names " + names +
                             ": the checkpoint holds a mixture of experts, whose routing its fields do not record; "
                             "export it from the program (sw::consolidate with sw::transformers_llama_mapping and "
                             "models::write_llama_config), or consolidate with --names shardwise");
  sw::models::LlamaConfig c;
  c.vocabulary = count("vocabulary"), c.dim = count("dim"), c.layers = count("layers"), c.heads = count("heads");
  c.kv_heads = count("kv_heads"), c.hidden = count("hidden");
  c.norm_eps = config_field(index, "norm_eps", names.c_str());
  c.rope_theta = config_field(index, "rope_theta", names.c_str());
  auto const flag = [&](char const* field) {
    auto const found = index.config.find(field);
    return found != index.config.end() && found->second == "true";
  };
  c.tie_word_embeddings = flag("tie_word_embeddings");
  c.attention_bias = flag("attention_bias"), c.attention_output_bias = flag("attention_output_bias");
  c.mlp_bias = flag("mlp_bias");
  c.qk_norm = flag("qk_norm");
  if (index.config.contains("head_dim")) c.explicit_head_dim = count("head_dim");  // recorded only when set
  c.rope_scaling = sw::models::RopeScaling::from_fields(index.config);
  if (index.config.contains("sliding_window"))  // recorded only when set
    c.sliding_window = count("sliding_window"), c.first_window_layer = count_or_zero("first_window_layer");
  auto json = sw::models::llama_config_to_json(c);
  // transformers-qwen2, -qwen3 and -mistral name the family the checkpoint must be: Llama's tensor names (and
  // Qwen3's q_norm and k_norm).
  std::string const family = names.substr(std::string("transformers-").size());
  if (family != "llama" && json["model_type"] != family)
    throw std::runtime_error("shardwise consolidate --names " + names + ": the checkpoint's configuration is a " +
                             json["model_type"].get<std::string>() +
                             "'s (its biases, norms and sliding window), not a " + family +
                             "'s; consolidate it with --names transformers-" + json["model_type"].get<std::string>());
  json.erase("max_position_embeddings");
  if (auto const& r = c.rope_scaling; r.type == sw::models::rope_type::llama3 || r.type == sw::models::rope_type::yarn)
    json["max_position_embeddings"] = static_cast<std::size_t>(double(r.original_max_positions) * r.factor);
  if (auto const& r = c.rope_scaling; r.type == sw::models::rope_type::dynamic)  // where its lengths raise the base
    json["max_position_embeddings"] = r.original_max_positions;
  return json;
}

int consolidate(std::string const& checkpoint, std::string const& output_dir, bool remove, std::string const& names) {
  fs::path const source = sw::find_checkpoint_folder(checkpoint);
  sw::consolidate_options options;
  std::string config_text;  // transformers' config.json, made before anything is written: it may be refused
  if (names != "shardwise") {
    auto const saved = sw::read_checkpoint_index(source);
    config_text = transformers_config(saved, names).dump(2) + "\n";
    if (names != "transformers-gpt2") options.mapping = sw::transformers_llama_mapping();
    auto const dim = static_cast<std::uint64_t>(config_field(saved, "dim", names.c_str()));
    if (names == "transformers-gpt2") options.mapping = sw::transformers_gpt2_mapping(dim);
  }
  options.progress = [](std::size_t i, std::size_t n, std::string const& name, std::uint64_t bytes) {
    std::fprintf(stderr, "[%zu/%zu] %s (%s)\n", i + 1, n, name.c_str(), human_bytes(bytes).c_str());
  };
  fs::path const file = fs::path(output_dir) / "model.safetensors";
  auto const index = sw::consolidate(source, file, options);  // refuses an output inside the checkpoint
  if (!config_text.empty()) {
    std::span<std::byte const> const piece(reinterpret_cast<std::byte const*>(config_text.data()), config_text.size());
    sw::detail::write_file_atomically(fs::path(output_dir) / "config.json", std::span(&piece, 1));
  }
  std::size_t const written = sw::safetensors_file(file.string()).tensors().size();  // not the optimizer state
  std::fprintf(stderr, "wrote %s: %zu tensors, %s, step %lld (saved at tp %d x pp %d x dp %d)\n", file.c_str(), written,
               human_bytes(fs::file_size(file)).c_str(), static_cast<long long>(index.step), index.tp, index.pp,
               index.dp);
  if (remove) {
    fs::remove_all(source);
    std::fprintf(stderr, "removed %s\n", source.c_str());
  }
  return 0;
}

std::string shape_of(std::vector<std::uint64_t> const& shape) { return sw::detail::shape_text(shape); }

/// Prints each problem to stderr; 0 when there are none.
int report(std::vector<std::string> const& problems, char const* what) {
  for (auto const& p : problems) std::fprintf(stderr, "problem: %s\n", p.c_str());
  if (!problems.empty()) std::fprintf(stderr, "%zu problem(s) in the %s\n", problems.size(), what);
  return problems.empty() ? 0 : 1;
}

/// The safetensors file `path` names: the file, or model.safetensors in the folder.
fs::path safetensors_path(std::string const& path) {
  return fs::is_directory(path) ? fs::path(path) / "model.safetensors" : fs::path(path);
}

/// Whether `path` is a sharded checkpoint (rather than a safetensors file, or a folder holding one).
bool is_sharded_checkpoint(std::string const& path) {
  return fs::is_directory(path) && !fs::exists(fs::path(path) / "model.safetensors");
}

int verify(std::string const& path) {
  if (!is_sharded_checkpoint(path)) {  // a consolidated file: its tensors against the checksums it records
    fs::path const file = safetensors_path(path);
    auto const problems = sw::verify_safetensors_file(file.string());
    if (problems.empty())
      std::cout << "safetensors " << file.string()
                << (sw::safetensors_file(file.string()).metadata().count(sw::checksums_metadata_key)
                        ? ": every tensor is as its writer wrote it\n"
                        : ": it records no checksums (not written by shardwise consolidate); its header reads\n");
    return report(problems, "file");
  }
  fs::path const dir = sw::find_checkpoint_folder(path);
  auto const problems = sw::verify_checkpoint(dir, true);
  if (problems.empty())
    std::cout << "checkpoint " << dir.string() << ": every rank file and every checksum is as its save wrote it\n";
  return report(problems, "checkpoint");
}

int inspect(std::string const& path) {
  if (is_sharded_checkpoint(path)) {
    fs::path const dir = sw::find_checkpoint_folder(path);
    auto const index = sw::read_checkpoint_index(dir);
    auto const optimizer_state = std::count_if(index.tensors.begin(), index.tensors.end(), [](auto const& t) {
      return t.name.starts_with(sw::optimizer_state_prefix);
    });
    std::cout << "sharded checkpoint " << dir.string() << ": step " << index.step << ", mesh tp " << index.tp
              << " x pp " << index.pp << " x dp " << index.dp << ", "
              << index.tensors.size() - static_cast<std::size_t>(optimizer_state) << " tensors";
    if (optimizer_state > 0) std::cout << " (and " << optimizer_state << " of optimizer state)";
    std::cout << '\n';
    for (auto const& [k, v] : index.metadata) std::cout << "  metadata " << k << " = " << v << '\n';
    for (auto const& t : index.tensors)
      std::cout << "  " << t.name << "  " << sw::dtype_name(t.type) << ' ' << shape_of(t.shape) << "  tp "
                << t.placement << "  " << t.pieces.size() << (t.pieces.size() == 1 ? " piece" : " pieces") << '\n';
    return report(sw::verify_checkpoint(dir, false), "rank files");
  }
  fs::path const file = safetensors_path(path);
  sw::safetensors_file f(file.string());
  std::uint64_t total = 0;
  for (auto const& t : f.tensors()) total += t.bytes();
  std::cout << "safetensors " << file.string() << ": " << f.tensors().size() << " tensors, " << human_bytes(total)
            << '\n';
  for (auto const& [k, v] : f.metadata()) std::cout << "  metadata " << k << " = " << v << '\n';
  for (auto const& t : f.tensors())
    std::cout << "  " << t.name << "  " << sw::dtype_name(t.type) << ' ' << shape_of(t.shape) << "  "
              << human_bytes(t.bytes()) << '\n';
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardwise: sharded checkpoints and safetensors files, and plans for clusters"};
  app.require_subcommand(1);

  std::string checkpoint, output, names = "shardwise";
  bool remove = false;
  auto* cons = app.add_subcommand(
      "consolidate",
      "Writes the full tensors of a sharded checkpoint (save_sharded) into OUTPUT_DIR/model.safetensors");
  cons->add_option("CHECKPOINT_DIR", checkpoint,
                   "The folder holding shardwise_checkpoint.json and tensor_parallel_shards, or that "
                   "tensor_parallel_shards folder itself")
      ->required();
  cons->add_option("OUTPUT_DIR", output, "Where to write model.safetensors (created if needed)")->required();
  cons->add_flag("--remove-checkpoint-dir", remove,
                 "Remove the sharded checkpoint once the consolidated file is written");
  cons->add_option("--names", names,
                   "Tensor names and layouts: shardwise's, transformers-llama (LlamaForCausalLM's, or the Qwen2, Qwen3 "
                   "or Mistral one its configuration is), transformers-qwen2, transformers-qwen3 or "
                   "transformers-mistral (the same names; "
                   "the configuration must be that family's) or transformers-gpt2 (GPT2LMHeadModel's: q, k and v "
                   "fused into c_attn, Conv1D weights transposed)")
      ->check(CLI::IsMember({"shardwise", "transformers-llama", "transformers-qwen2", "transformers-qwen3",
                             "transformers-mistral", "transformers-gpt2"}))
      ->capture_default_str();

  std::string target;
  auto* insp = app.add_subcommand(
      "inspect", "Lists the tensors (shapes, dtypes, placements) of a safetensors file or a sharded checkpoint");
  insp->add_option("FILE_OR_DIR", target,
                   "A .safetensors file, a folder with model.safetensors, or a sharded checkpoint")
      ->required();

  std::string verified;
  auto* ver =
      app.add_subcommand("verify",
                         "Checks a sharded checkpoint (its rank files, every tensor piece against the checksum its "
                         "save recorded) or a consolidated file (every tensor against its checksum); exits 1 "
                         "naming each problem");
  ver->add_option("CHECKPOINT_OR_FILE", verified,
                  "The folder holding shardwise_checkpoint.json, or a consolidated .safetensors file (or its folder)")
      ->required();

  plan_command::options planned;
  std::string memory;
  auto* plan =
      app.add_subcommand("plan",
                         "The layouts (dp x pp x tp, microbatches, ZeRO-1 or FSDP, activation "
                         "checkpointing) of a Llama, Qwen2, Mistral or GPT-2 model that fit in the memory per rank, "
                         "fastest first");
  plan->add_option("CONFIG", planned.config,
                   "A transformers config.json (model_type llama, qwen2, qwen3, mistral or gpt2)")
      ->required();
  // Counts are bounded so that the search stays short (every layout of the ranks, every microbatch count of the
  // batch) and no product of them wraps.
  using plan_command::count_from;
  plan->add_option("--ranks", planned.ranks, "Ranks (processes) in the job")
      ->required()
      ->check(count_from(1, 1 << 20, "the ranks (processes) in the job"));
  plan->add_option("--memory-per-rank", memory, "Bytes each rank may hold: 80GiB, 40GB, 8e10")
      ->required()
      ->check([](std::string const& text) {
        return plan_command::parse_bytes(text) ? std::string() : "not a size in bytes (say 80GiB or 8e10)";
      });
  plan->add_option("--machine", planned.machine,
                   "A machine file (JSON: gemm_flops, gemm_half_rate_tokens, memory_bandwidth, ranks_per_node, "
                   "tp/dp/pp bandwidth and latency; bench_machine writes one), or \"calibrate\": this machine measured "
                   "once (a few seconds) and kept in $XDG_CACHE_HOME/shardwise; default: the built-in values");
  plan->add_option("--batch", planned.batch, "Sequences per optimizer step")
      ->check(count_from(1, 1 << 24, "the sequences per optimizer step"))
      ->capture_default_str();
  // Required: max_position_embeddings is the longest sequence a model takes (131072 for Qwen2), rarely the
  // length it trains at, and a default of it plans steps of a hundred million tokens.
  plan->add_option("--sequence", planned.sequence,
                   "Tokens per sequence you train with (max_position_embeddings is only the longest the model takes)")
      ->required()
      ->check(count_from(1, 1 << 24, "the tokens per sequence you train with"));
  plan->add_option("--precision", planned.precision, "bf16 (mixed, fp32 master weights) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  plan->add_option("--top", planned.top, "How many layouts to print")
      ->check(count_from(1, 1 << 20, "how many layouts to print"))
      ->capture_default_str();
  plan->add_option("--dp", planned.only.dp, "Only layouts with this many data-parallel ranks")
      ->check(count_from(1, 1 << 20, "the data-parallel ranks to keep fixed"));
  plan->add_option("--pp", planned.only.pp, "Only layouts with this many pipeline stages")
      ->check(count_from(1, 1 << 20, "the pipeline stages to keep fixed"));
  plan->add_option("--tp", planned.only.tp, "Only layouts with this many tensor-parallel ranks")
      ->check(count_from(1, 1 << 20, "the tensor-parallel ranks to keep fixed"));
  plan->add_option("--cp", planned.only.cp, "Only layouts with this many context-parallel ranks (1: none)")
      ->check(count_from(1, shardwise::planner::most_context_ranks, "the context-parallel ranks to keep fixed"));

  plan->add_option("--state", planned.state,
                   "Only layouts whose optimizer state is replicated, zero1 (sharded over dp) or fsdp (parameters, "
                   "gradients and state sharded)")
      ->check(CLI::IsMember({"replicated", "zero1", "fsdp"}));

  plan->add_option("--schedule", planned.schedule,
                   "The pipeline schedule of layouts with stages: 1f1b (the default), zbh1 (ZB-H1) or zbv (ZBV: two "
                   "chunks per rank, where twice the stages divide the layers)")
      ->check(CLI::IsMember({"1f1b", "zbh1", "zbv"}));

  CLI11_PARSE(app, argc, argv);
  try {
    if (*cons) return consolidate(checkpoint, output, remove, names);
    if (*ver) return verify(verified);
    if (*plan) {
      planned.memory_per_rank = plan_command::parse_bytes(memory);
      return plan_command::run(planned);
    }
    return inspect(target);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
