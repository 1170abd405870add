// Generates tokens with a Llama (Llama 2 and 3.x, Qwen2, Mistral) or GPT-2 model, tensor-parallel over every
// rank, with a key-value cache: from a transformers save_pretrained folder (config.json and model.safetensors, or
// shards with model.safetensors.index.json), loaded lazily so that each rank reads and holds only its shard; or,
// given no folder, from a random Llama. Token ids in, token ids out: the model's own tokenizer turns text into ids
// and back (docs/inference.md shows it in two lines of Python). A folder it cannot run, or a rank count the heads
// do not divide over, ends it with the reason (printed once per process) and exit code 1.
//
//   ./generate                                          # a random Llama, tp 2 on threads
//   ./generate FOLDER --prompt 1,450,4996 --new 32     # a save_pretrained folder, greedy
//   SHARDWISE_THREADS=4 ./generate FOLDER --prompt 1,450 --prompt 1,3186 --temperature 0.8 --top-p 0.9 --seed 3
//   mpiexec -n 2 ./generate FOLDER --prompt 1,450,4996
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <shardwise/inference.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/gpt2_config_json.hpp>
#include <shardwise/models/gpt2_names.hpp>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

namespace {

struct arguments {
  std::filesystem::path folder;  // empty: a random Llama
  std::vector<std::vector<std::int64_t>> prompts;
  sw::generation_options generation{.max_new_tokens = 32};
};

std::vector<std::int64_t> ids_of(std::string const& text) {
  std::vector<std::int64_t> ids;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t const comma = text.find(',', at);
    std::size_t used = 0;
    ids.push_back(std::stoll(text.substr(at, comma - at), &used));
    if (used != (comma == std::string::npos ? text.size() : comma) - at) throw std::invalid_argument(text);
    at = comma == std::string::npos ? text.size() : comma + 1;
  }
  return ids;
}

arguments parse(int argc, char** argv) {
  arguments a;
  for (int i = 1; i < argc; ++i) {
    std::string const flag = argv[i];
    if (flag.rfind("--", 0) != 0) {
      a.folder = flag;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    std::string const value = argv[++i];
    if (flag == "--prompt")
      a.prompts.push_back(ids_of(value));
    else if (flag == "--new")
      a.generation.max_new_tokens = std::stoi(value);
    else if (flag == "--temperature")
      a.generation.temperature = std::stod(value);
    else if (flag == "--top-k")
      a.generation.top_k = std::stoll(value);
    else if (flag == "--top-p")
      a.generation.top_p = std::stod(value);
    else if (flag == "--seed")
      a.generation.seed = std::stoull(value);
    else if (flag == "--stop")
      a.generation.stop_tokens.push_back(std::stoll(value));
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
  if (a.prompts.empty()) a.prompts = {{1, 15, 29, 7, 42}, {3, 4}, {9, 8, 7, 6, 5, 4, 3, 2}};
  return a;
}

/// Generates on every rank (all pick the same tokens); rank 0 prints them.
template <class Model, class Tp>
void run(Model& model, Tp const& tp, arguments const& a, char const* what) {
  sw::generation const g = sw::generate(model, tp, a.prompts, a.generation);
  if (tp.rank() != 0) return;
  std::printf("%s, tp %d\n", what, tp.size());
  for (std::size_t i = 0; i < g.tokens.size(); ++i) {
    std::printf("prompt %zu (%zu tokens) ->", i, a.prompts[i].size());
    for (std::int64_t id : g.tokens[i]) std::printf(" %lld", static_cast<long long>(id));
    std::printf("\n");
  }
  std::printf("first tokens after %.3f s; then %zu tokens at %.1f tokens/s; key-value cache %.2f MiB per rank\n",
              g.first_token_seconds, g.decoded_tokens, g.decode_tokens_per_second(), double(g.cache_bytes) / (1 << 20));
}

/// A random Llama, or the model of the folder given, generating on `world`'s ranks as one tp group.
template <class World>
void generate_on(World& world, arguments const& a) {
  auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {world.size()}));
  if (a.folder.empty()) {  // a random Llama: grouped-query attention, tied embeddings
    models::Llama<float, models::llama_plan<false>> model(
        {.vocabulary = 512, .dim = 256, .layers = 4, .heads = 8, .kv_heads = 2, .hidden = 704, .sequence = 256});
    sw::parallelize(model, tp);
    run(model, tp, a, "a random Llama");
    return;
  }
  std::string const type = models::transformers_model_type(a.folder / "config.json");
  if (models::reads_as_llama(type)) {  // llama, qwen2, mistral
    sw::Lazy<models::Llama<float, models::llama_plan<false>>> lazy(models::read_llama_config(a.folder / "config.json"));
    sw::parallelize(lazy, tp);
    run(sw::load_pretrained(lazy, tp, a.folder, sw::transformers_llama_mapping()), tp, a, "Llama");
  } else if (type == "gpt2") {
    auto const config = models::read_gpt2_config(a.folder / "config.json");
    sw::Lazy<models::GPT2<float, models::gpt2_plan<false>>> lazy(config);
    sw::parallelize(lazy, tp);
    run(sw::load_pretrained(lazy, tp, a.folder, sw::transformers_gpt2_mapping(config.dim)), tp, a, "GPT-2");
  } else {
    sw::raise(a.folder.string(), " holds a \"", type, "\" model; this example runs llama, qwen2, mistral and gpt2");
  }
}

}  // namespace

int main(int argc, char** argv) {
  arguments a;
  try {
    a = parse(argc, argv);
  } catch (std::exception const& e) {
    std::fprintf(stderr,
                 "generate: %s\nusage: generate [FOLDER] [--prompt ID,ID,...]... [--new N] [--temperature T] "
                 "[--top-k K] [--top-p P] [--seed S] [--stop ID]...\n",
                 e.what());
    return 2;
  }
  try {  // a refusal (a tp size the heads do not serve, a folder of another model) ends with its words and exit 1
    sw::launch(argc, argv, /*threads=*/2, [&](auto& world) { generate_on(world, a); });
  } catch (std::exception const& e) {  // every rank has the same words: each process prints them once
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
