// Fine-tunes a transformers model with LoRA, as peft users do, sharded tp 2 x dp 2: a save_pretrained folder in
// (Llama 3.x, Qwen2/2.5/3, Mistral, SmolLM2: config.json + model.safetensors), LoRA adapters on q, k, v and o,
// documents tokenised beforehand and packed into rows, the prompts' targets masked, a warm-up then a cosine decay,
// gradient accumulation with the loss over the step's valid tokens; the adapter saved in peft's files (it loads in
// PeftModel.from_pretrained), then greedy generation with the adapters merged into the weights.
//
//   ./finetune                                  # a small random Llama and documents made from the GPL (a demo)
//   ./finetune FOLDER --data train.tsv --steps 200 --out run/   # 4 threads: dp 2 x tp 2
//   mpiexec -n 4 ./finetune FOLDER --data train.tsv
//
// train.tsv: one document a line, the prompt's token ids, a tab, the response's (docs/fine-tuning-recipe.md makes
// it with the model's tokenizer in two lines of Python). The loss is taken on the responses' tokens only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <shardwise/checkpoint/peft.hpp>
#include <shardwise/inference.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

struct arguments {
  fs::path folder, data, out = fs::temp_directory_path() / "shardwise-finetune";
  int steps = 40, microbatches = 2, rows_per_microbatch = 2;
  double learning_rate = 2e-3;
};

/// One tokenised document: the prompt's ids, then the response's.
struct document {
  std::vector<std::int64_t> prompt, response;
};

/// Reads train.tsv: every id checked against the vocabulary, the line named when one is not.
std::vector<document> read_documents(fs::path const& path, std::size_t vocabulary) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::vector<document> docs;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    std::size_t const tab = line.find('\t');
    if (tab == std::string::npos) throw std::runtime_error(path.string() + ":" + std::to_string(number) + ": no tab");
    document d;
    for (auto* part : {&d.prompt, &d.response}) {
      std::istringstream ids(part == &d.prompt ? line.substr(0, tab) : line.substr(tab + 1));
      for (long long id; ids >> id;) {
        if (id < 0 || static_cast<std::size_t>(id) >= vocabulary)
          throw std::runtime_error(path.string() + ":" + std::to_string(number) + ": token " + std::to_string(id) +
                                   " is outside the vocabulary of " + std::to_string(vocabulary));
        part->push_back(id);
      }
    }
    if (!d.response.empty()) docs.push_back(std::move(d));
  }
  if (docs.empty()) throw std::runtime_error(path.string() + " holds no document with a response");
  return docs;
}

/// Rows of `length` tokens packed with whole documents (one longer than a row is cut to it), each document its own
/// sequence for attention; the targets: the next token of the response, -100 on the prompt and at the document's
/// end; the row's rest is a filler sequence with no target.
struct packed_rows {
  std::vector<std::vector<std::int64_t>> ids, targets;
  std::vector<std::vector<std::size_t>> lengths;
};

packed_rows pack(std::vector<document> const& docs, std::size_t length) {
  packed_rows rows;
  auto open_row = [&] { rows.ids.emplace_back(), rows.targets.emplace_back(), rows.lengths.emplace_back(); };
  auto fill_row = [&] {
    std::size_t const rest = length - rows.ids.back().size();
    if (rest == 0) return;
    rows.ids.back().insert(rows.ids.back().end(), rest, 0);
    rows.targets.back().insert(rows.targets.back().end(), rest, -100);
    rows.lengths.back().push_back(rest);
  };
  open_row();
  for (document const& d : docs) {
    std::vector<std::int64_t> tokens = d.prompt;
    tokens.insert(tokens.end(), d.response.begin(), d.response.end());
    tokens.resize(std::min(tokens.size(), length));
    if (rows.ids.back().size() + tokens.size() > length) fill_row(), open_row();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      bool const learned = i + 1 < tokens.size() && i + 1 >= d.prompt.size();  // the next token is the response's
      rows.ids.back().push_back(tokens[i]);
      rows.targets.back().push_back(learned ? tokens[i + 1] : -100);
    }
    rows.lengths.back().push_back(tokens.size());
  }
  fill_row();
  return rows;
}

/// The demo's inputs when no folder is given: a small random Llama saved as save_pretrained saves it, and the GPL's
/// paragraphs as documents of bytes (prompt: the paragraph's first line).
void write_demo(fs::path const& out) {
  models::LlamaConfig const config{
      .vocabulary = 256, .dim = 128, .layers = 2, .heads = 4, .kv_heads = 2, .hidden = 352, .sequence = 128};
  models::Llama<float> model(config);
  auto const serial = sw::make_mesh<"tp">(sw::serial_world(), {1});
  sw::save_sharded(model, serial, out / "demo-sharded", 0);
  sw::consolidate(out / "demo-sharded", out / "demo-model" / "model.safetensors",
                  {.mapping = sw::transformers_llama_mapping(), .progress = {}});
  models::write_llama_config(config, out / "demo-model" / "config.json");
  std::ifstream gpl("/usr/share/common-licenses/GPL-3");
  std::string const text((std::istreambuf_iterator<char>(gpl)), std::istreambuf_iterator<char>());
  std::ofstream tsv(out / "demo.tsv");
  for (std::size_t at = 0; at < text.size();) {
    std::size_t const end = std::min(text.find("\n\n", at), text.size());
    std::string const paragraph = text.substr(at, end - at);
    std::size_t const newline = paragraph.find('\n');
    auto const write_bytes = [&](std::string_view bytes) {
      for (std::size_t i = 0; i < bytes.size(); ++i)
        tsv << (i == 0 ? "" : " ") << static_cast<int>(static_cast<unsigned char>(bytes[i]));
    };
    if (newline != std::string::npos && newline + 1 < paragraph.size()) {
      write_bytes(std::string_view(paragraph).substr(0, newline));
      tsv << '\t';
      write_bytes(std::string_view(paragraph).substr(newline + 1));
      tsv << '\n';
    }
    at = end + 2;
  }
}

/// The fine-tuning on dp x tp = {2, world / 2} (or dp 1 on an odd world).
template <class World>
void finetune(World& world, arguments const& a, bool& learned) {
  int const dp_size = world.size() % 2 == 0 ? 2 : 1;
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, world.size() / dp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);

  // The base model, each rank reading only its shard; the adapters cut as each weight is, the rest frozen. (Tensor
  // parallel without sequence parallelism, which generation with a key-value cache needs.)
  sw::Lazy<models::Llama<float, models::llama_plan<false>>> lazy(models::read_llama_config(a.folder / "config.json"));
  sw::parallelize(lazy, tp);
  auto& model = sw::load_pretrained(lazy, tp, a.folder, sw::transformers_llama_mapping());
  sw::LoraConfig const lora{.rank = 8, .alpha = 16, .target_modules = {"layers.*.attention.w[qkvo]"}};
  sw::add_lora(model, lora);

  auto const& config = model.config();
  packed_rows const rows = pack(read_documents(a.data, config.vocabulary), config.sequence);
  int const rows_per_step = a.microbatches * a.rows_per_microbatch * dp_size;
  sw::AdamW<float> optimizer({.learning_rate = float(a.learning_rate),
                              .weight_decay = 0.0f,
                              .max_grad_norm = 1.0f,
                              .schedule = {.kind = sw::schedule_kind::cosine,
                                           .warmup_steps = std::size_t(std::max(1, a.steps / 10)),
                                           .total_steps = std::size_t(a.steps),
                                           .min_lr_rate = 0.1}});
  std::size_t elements = 0;  // this rank's
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { elements += std::size_t(p.value->size()); });
  if (world.rank() == 0)
    std::printf("%zu packed rows of %zu tokens; LoRA r %zu: %zu of this rank's %zu parameters trained; dp %d x tp %d\n",
                rows.ids.size(), config.sequence, lora.rank, sw::trainable_elements(model), elements, dp_size,
                tp.size());
  auto const began = std::chrono::steady_clock::now();
  double first_loss = 0, last_loss = 0;
  for (int step = 1; step <= a.steps; ++step) {
    // This rank's microbatches: rows_per_microbatch rows each, the step's rows dealt out over dp.
    std::vector<std::vector<std::int64_t>> ids(a.microbatches), targets(a.microbatches);
    std::vector<std::vector<std::size_t>> lengths(a.microbatches);
    for (int m = 0; m < a.microbatches; ++m)
      for (int r = 0; r < a.rows_per_microbatch; ++r) {
        std::size_t const row =
            std::size_t((step - 1) * rows_per_step + (dp.rank() * a.microbatches + m) * a.rows_per_microbatch + r) %
            rows.ids.size();
        ids[m].insert(ids[m].end(), rows.ids[row].begin(), rows.ids[row].end());
        targets[m].insert(targets[m].end(), rows.targets[row].begin(), rows.targets[row].end());
        lengths[m].insert(lengths[m].end(), rows.lengths[row].begin(), rows.lengths[row].end());
      }
    sw::valid_tokens const tokens = sw::count_valid_tokens(dp, targets);  // one all-reduce: the step's mean
    double loss = 0;
    for (int m = 0; m < a.microbatches; ++m) {
      auto const result = models::llama_loss(tp, model.forward(ids[m], sw::sequence_lengths(lengths[m])), targets[m],
                                             config.vocabulary, tokens);
      model.backward(result.dlogits);
      loss += result.loss;
    }
    optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
    loss = sw::all_reduce(dp, loss, sw::Sum{});  // the shares add up to the step's mean
    (step == 1 ? first_loss : last_loss) = loss;
    if (world.rank() == 0 && (step == 1 || step % 10 == 0 || step == a.steps)) {
      double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      std::printf("step %4d/%d  loss %.4f  lr %.2e  %6.0f tokens/s\n", step, a.steps, loss, optimizer.learning_rate(),
                  double(step) * rows_per_step * double(config.sequence) / seconds);
      std::fflush(stdout);
    }
  }

  // The adapter in peft's files; then merged into the weights (each rank its piece) and generating greedily.
  sw::save_lora(model, tp, dp, a.out / "adapter", lora, sw::transformers_llama_name, a.folder.string());
  sw::merge_lora(model);
  std::vector<std::int64_t> const& prompt = rows.ids.front();
  std::size_t const prompt_length = std::min<std::size_t>(rows.lengths.front().front(), 16);
  sw::generation const g = sw::generate(model, tp, {{prompt.begin(), prompt.begin() + std::ptrdiff_t(prompt_length)}},
                                        {.max_new_tokens = 16});
  if (world.rank() != 0) return;
  std::printf("generated:");
  for (std::int64_t id : g.tokens.front()) std::printf(" %lld", static_cast<long long>(id));
  std::printf("\nLoRA on dp %d x tp %d: loss %.3f -> %.3f over %d steps; adapter in %s\n", dp_size, tp.size(),
              first_loss, last_loss, a.steps, (a.out / "adapter").c_str());
  learned = last_loss < first_loss;
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
    if (flag == "--data")
      a.data = value;
    else if (flag == "--out")
      a.out = value;
    else if (flag == "--steps")
      a.steps = std::stoi(value);
    else if (flag == "--microbatches")
      a.microbatches = std::stoi(value);
    else if (flag == "--lr")
      a.learning_rate = std::stod(value);
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
  if (a.steps < 1 || a.microbatches < 1) throw std::invalid_argument("--steps and --microbatches take 1 or more");
  if (a.folder.empty() != a.data.empty()) throw std::invalid_argument("give a folder and --data together, or neither");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  arguments a;
  try {
    a = parse(argc, argv);
    if (a.folder.empty() && sw::launched_by_mpi()) throw std::invalid_argument("under mpiexec, give a folder");
    if (a.folder.empty()) {  // the demo (on threads): its model and documents first
      write_demo(a.out);
      a.folder = a.out / "demo-model", a.data = a.out / "demo.tsv";
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr,
                 "finetune: %s\nusage: finetune [FOLDER --data FILE] [--steps N] [--microbatches N] [--lr LR] "
                 "[--out DIR]\n",
                 e.what());
    return 2;
  }
  bool learned = true;  // rank 0's verdict
  try {
    sw::launch(argc, argv, /*threads=*/4, [&](auto& world) { finetune(world, a, learned); });
  } catch (std::exception const& e) {  // every rank has the same words: each process prints them once
    std::fprintf(stderr, "finetune: %s\n", e.what());
    return 1;
  }
  if (!learned) std::printf("WRONG: the loss did not go down\n");
  return learned ? 0 : 1;
}
