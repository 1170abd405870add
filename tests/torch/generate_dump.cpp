// The C++ half of the comparison of sw::generate with transformers' generate (generate_reference.py is the other
// half and shares no code with this file). For each save_pretrained folder generate_reference.py wrote (DIR/llama:
// grouped-query, 4 heads and 2 key-value heads, as shards with model.safetensors.index.json; DIR/llama_kv1: one
// key-value head, repeated at tp 2 and 4 by kv_size_multiplier; DIR/gpt2: tied head; DIR/llama3_rope, yarn_rope,
// linear_rope and dynamic_rope (NTK beyond 6 positions): the rotary scalings; DIR/qwen2: Qwen2, biases on q, k and v;
// DIR/llama_bias: Llama's attention and feed-forward biases; DIR/smollm: 9 heads and 3 key-value heads, tied, at tp 1
// and 3; DIR/mistral: a sliding window of 4 on every layer; DIR/qwen2_window: Qwen2's window of 3 on its second layer;
// DIR/qwen3: Qwen3's q and k norms, heads of 16 on a width of 32), loaded lazily at tp 1, 2 and 4 on threads
// (generate_dump DIR) or at the MPI world's size (mpiexec -n N generate_dump --mpi DIR), it writes
// DIR/<model>/<tag>_<fp32|fp64>.txt: greedy generation of 64 tokens after each prompt of DIR/prompts.txt, every
// step's logits; and for fp32 a sampled generation (temperature 0.9, top-k 12, top-p 0.85, seed 11) with every
// step's logits and the draw each token was picked with. For the Llama-type folders also
// DIR/<model>/<tag>_<fp32|fp64>_packed.txt: the forward's logits of the prompts packed into one row.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <shardwise/inference.hpp>
#include <shardwise/models/gpt2_config_json.hpp>
#include <shardwise/models/gpt2_names.hpp>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>
#ifndef SHARDWISE_DUMP_WITHOUT_MPI
#include <shardwise/mesh/mpi/comm.hpp>
#endif

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

using prompt_list = std::vector<std::vector<std::int64_t>>;

sw::generation_options greedy() { return {.max_new_tokens = 64}; }
sw::generation_options sampled() {
  return {.max_new_tokens = 64, .temperature = 0.9, .top_k = 12, .top_p = 0.85, .seed = 11};
}

prompt_list read_prompts(fs::path const& file) {
  std::ifstream in(file);
  prompt_list prompts;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    auto& p = prompts.emplace_back();
    for (std::int64_t id; ids >> id;) p.push_back(id);
  }
  return prompts;
}

/// Generates with `options` and writes the tokens, each step's logits and, when sampling, the draws.
template <class Model, class Tp>
void dump(Model& model, Tp const& tp, prompt_list const& prompts, sw::generation_options const& options,
          std::FILE* out) {
  sw::token_draws draws(options.seed);  // generate's draws, in its order: per step, the running sequences'
  std::vector<std::size_t> steps(prompts.size(), 0);
  auto record = [&](std::size_t, std::span<const std::size_t> sequences, auto const& logits) {
    for (std::size_t r = 0; r < sequences.size(); ++r) {
      std::size_t const i = sequences[r], t = steps[i]++;
      if (options.temperature > 0) std::fprintf(out, "draw %zu %zu %.17g\n", i, t, draws.next());
      std::fprintf(out, "logits %zu %zu", i, t);
      for (Eigen::Index j = 0; j < logits.cols(); ++j) std::fprintf(out, " %.17g", double(logits(Eigen::Index(r), j)));
      std::fprintf(out, "\n");
    }
  };
  auto const g = sw::generate(model, tp, prompts, options, record);
  for (std::size_t i = 0; i < g.tokens.size(); ++i) {
    std::fprintf(out, "tokens %zu", i);
    for (std::int64_t id : g.tokens[i]) std::fprintf(out, " %lld", static_cast<long long>(id));
    std::fprintf(out, "\n");
  }
}

/// The prompts packed into one row (sw::sequence_lengths, each attending within itself): one line of logits per
/// token, written by rank 0. generate_reference.py compares them with transformers' forward of each prompt alone.
template <class Model, class Tp>
void dump_packed(Model& model, Tp const& tp, prompt_list const& prompts, fs::path const& file) {
  std::vector<std::int64_t> ids;
  std::vector<std::size_t> lengths;
  for (auto const& p : prompts) ids.insert(ids.end(), p.begin(), p.end()), lengths.push_back(p.size());
  auto const logits = model.forward(ids, sw::sequence_lengths(lengths));
  sw::nn::matrix<double> whole = logits.local.template cast<double>();
  if constexpr (!std::is_same_v<typename std::remove_cvref_t<decltype(logits)>::placement, sw::Replicate>)
    sw::all_gather(tp, logits.local.template cast<double>().eval(), whole, -1);  // vocabulary-sharded, whole
  sw::drop_saved_activations(model);
  whole = whole.leftCols(Eigen::Index(model.config().vocabulary)).eval();  // vocabulary padding left out
  if (tp.rank() != 0) return;
  std::FILE* out = std::fopen(file.c_str(), "w");
  for (Eigen::Index r = 0; r < whole.rows(); ++r) {
    for (Eigen::Index j = 0; j < whole.cols(); ++j) std::fprintf(out, j ? " %.17g" : "%.17g", whole(r, j));
    std::fprintf(out, "\n");
  }
  std::fclose(out);
}

/// The model of `folder`, loaded lazily at tp's size; each run of it written by rank 0 (the others to nowhere).
template <class T, class Tp>
void runs(fs::path const& folder, Tp const& tp, std::string const& tag, prompt_list const& prompts) {
  std::string const name = tag + (std::is_same_v<T, float> ? "_fp32" : "_fp64");
  std::FILE* out = std::fopen(tp.rank() == 0 ? (folder / (name + ".txt")).c_str() : "/dev/null", "w");
  auto const both = [&](auto& model) {
    dump(model, tp, prompts, greedy(), out);
    if (std::is_same_v<T, float>) dump(model, tp, prompts, sampled(), out);
  };
  if (models::transformers_model_type(folder / "config.json") == "gpt2") {
    auto const c = models::read_gpt2_config(folder / "config.json");
    sw::Lazy<models::GPT2<T, models::gpt2_plan<false>>> lazy(c);
    sw::parallelize(lazy, tp);
    both(sw::load_pretrained(lazy, tp, folder, sw::transformers_gpt2_mapping(c.dim)));
  } else {
    auto c = models::read_llama_config(folder / "config.json");
    c.sequence = std::max<std::size_t>(c.sequence, 128);  // the capacity: dynamic_rope's rows pass its 6 positions
    sw::Lazy<models::Llama<T, models::llama_plan<false>>> lazy(c);
    sw::parallelize(lazy, tp);
    auto& model = sw::load_pretrained(lazy, tp, folder, sw::transformers_llama_mapping());
    both(model);
    dump_packed(model, tp, prompts, folder / (name + "_packed.txt"));
  }
  std::fclose(out);
}

/// Every model the world's size serves: smollm's 9 heads at 1 and 3 ranks, the others' 4 at 1, 2 and 4.
template <class World>
void all_models(World const& world, fs::path const& dir, std::string const& tag) {
  auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {world.size()}));
  prompt_list const prompts = read_prompts(dir / "prompts.txt");
  for (char const* model : {"llama", "llama_kv1", "gpt2", "llama3_rope", "yarn_rope", "linear_rope", "dynamic_rope",
                            "qwen2", "llama_bias", "smollm", "mistral", "qwen2_window", "qwen3"}) {
    bool const nine_heads = std::string_view(model) == "smollm";
    if (world.size() != 1 && (world.size() == 3) != nine_heads) continue;
    runs<float>(dir / model, tp, tag, prompts);
    runs<double>(dir / model, tp, tag, prompts);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool const mpi = argc == 3 && std::strcmp(argv[1], "--mpi") == 0;
  if (argc != 2 && !mpi) {
    std::fprintf(stderr, "usage: generate_dump DIR | mpiexec -n N generate_dump --mpi DIR\n");
    return 2;
  }
  fs::path const dir = argv[argc - 1];
  if (mpi) {
#ifndef SHARDWISE_DUMP_WITHOUT_MPI
    auto const world = sw::mpi_world();
    all_models(world, dir, "mpi" + std::to_string(world.size()));
#else
    std::fprintf(stderr, "generate_dump: built without MPI\n");
    return 2;
#endif
  } else {
    for (int ranks : {1, 2, 3, 4})
      sw::run_threads(ranks, [&](sw::ThreadComm& world) { all_models(world, dir, "tp" + std::to_string(ranks)); });
  }
  return 0;
}
