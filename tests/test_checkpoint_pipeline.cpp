// Checkpoints of a Llama model cut into pipeline stages: saved at pp 2 x tp 2 after training, into
// tensor_parallel_shards/tp_rank_XX_pp_rank_YY; consolidated whole; loaded at pp 1 (into a stage and into the
// plain Llama model), pp 2 and pp 4, at tp 1, 2 and 4 — every tensor equal to the trained one, exactly; a lazy
// stage reads only its own tensors (another stage's damaged files do not stop it, its own do). Saved through an
// sw::async_save, the same loads. Saved with the optimizer's state, training resumes at another dp x pp x tp.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <shardwise/checkpoint/async_save.hpp>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <string>
#include <vector>

#include "cases/llama_pipeline_cases.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

struct scratch_dir {
  fs::path path;
  scratch_dir() : path(fs::temp_directory_path() / ("shardwise_test_ckpt_pipeline_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

using Tensors = std::map<std::string, std::vector<float>>;

std::atomic<int> reading_ranks{0};
void count_reading_ranks(std::string_view stage, int) {
  if (stage == "read_begin") ++reading_ranks;
}

/// Trains pp 2 x tp 2 (sequence parallel) for 3 steps and saves it (through an sw::async_save when `async`);
/// returns every trained tensor, whole.
Tensors train_and_save(fs::path const& dir, bool tied = false, bool async = false) {
  Tensors trained;
  std::mutex guard;
  sw::run_threads(4, [&](auto& world) {
    auto const save = [&](auto& stage, auto const& tp, auto const& pp) {
      if (!async) return sw::save_sharded(stage, tp, pp, dir, 3);
      sw::async_save saver;
      sw::save_sharded(stage, tp, pp, dir, 3, saver);
      CHECK(saver.pending());
      saver.wait();
    };
    auto const run = llama_pipeline_cases::train<models::llama_plan<true>>(
        world, {.pp = 2, .microbatches = 2, .tied = tied}, sw::OneFOneB{}, 3, save);
    std::lock_guard lock(guard);
    for (auto const& t : run.parameters) trained[t.path] = t.values;
  });
  return trained;
}

/// Loads `dir` into stage `stage` of `stages` at tp `tp_size` (a lazy stage when `lazy`) and returns its
/// tensors, whole.
template <class Plan, class Mesh>
Tensors load_stage(Mesh const& tp, fs::path const& dir, int stages, int stage, bool lazy, bool tied,
                   sw::load_options const& options) {
  auto const c = llama_pipeline_cases::config(tied);
  sw::stage_split const split(c.layers, stages);
  std::vector<llama_cases::TrainedTensor> loaded;
  if (lazy) {
    sw::Lazy<models::LlamaStage<float, Plan>> model(c, split, stage);
    sw::parallelize(model, tp);
    loaded = llama_pipeline_cases::parameters_of(sw::load_sharded(model, tp, dir, options));
  } else {
    models::LlamaStage<float, Plan> model(c, split, stage);
    sw::parallelize(model, tp);
    (void)sw::load_sharded(model, tp, dir, options);
    loaded = llama_pipeline_cases::parameters_of(model);
  }
  Tensors tensors;
  for (auto const& t : loaded) tensors[t.path] = t.values;
  return tensors;
}

/// Loads at pp `stages` x tp `tp_size` on threads; every stage's tensors must equal the trained ones, and
/// together the stages must hold every tensor. With `node_reads`, the node's first rank reads for every stage
/// (only_rank0_reads over sw::node_turns).
void check_load(Tensors const& trained, fs::path const& dir, int stages, int tp_size, bool lazy, bool tied = false,
                bool node_reads = false) {
  INFO("load at pp " << stages << " x tp " << tp_size << (lazy ? ", lazy" : "") << (node_reads ? ", node reads" : ""));
  Tensors seen;
  std::mutex guard;
  sw::run_threads(stages * tp_size, [&](auto& world) {
    auto const mesh = sw::make_mesh<"pp", "tp">(world, {stages, tp_size});
    auto const tp = sw::submesh<"tp">(mesh);
    int const stage = sw::coordinate<"pp">(mesh);
    sw::load_options options{.only_rank0_reads = node_reads};
    if (node_reads) options.turns = sw::node_turns(world);
    Tensors const mine = tp_size == 1
                             ? load_stage<sw::serial_plan>(tp, dir, stages, stage, lazy, tied, options)
                             : load_stage<models::llama_plan<true>>(tp, dir, stages, stage, lazy, tied, options);
    std::lock_guard lock(guard);
    for (auto const& tensor : mine) {  // (no structured binding: clang 14 cannot capture one in doctest's macros)
      if (seen.count(tensor.first))
        CHECK_MESSAGE(seen.at(tensor.first) == tensor.second, tensor.first << " differs between two stages");
      seen[tensor.first] = tensor.second;  // a tied output's copy comes under the embedding's name
    }
  });
  CHECK(seen.size() == trained.size());
  for (auto const& tensor : trained) {
    INFO(tensor.first);
    REQUIRE(seen.count(tensor.first) == 1);
    CHECK(seen.at(tensor.first) == tensor.second);
  }
}

}  // namespace

TEST_CASE("a pp 2 x tp 2 checkpoint names its pp ranks, consolidates whole and loads at pp 1, 2 and 4, any tp") {
  scratch_dir scratch;
  fs::path const dir = scratch.path / "ckpt";
  Tensors const trained = train_and_save(dir);
  REQUIRE(trained.size() == 2 + 9 * llama_pipeline_cases::config().layers + 1);  // every tensor of the model
  for (int pp = 0; pp < 2; ++pp)
    for (int tp = 0; tp < 2; ++tp) CHECK(fs::exists(dir / sw::rank_folder(tp, pp) / "model.safetensors"));
  CHECK(!fs::exists(dir / sw::rank_folder(0, 2)));
  auto const index = sw::read_checkpoint_index(dir);
  CHECK(index.pp == 2);
  CHECK(index.tp == 2);
  CHECK(index.find("layers.3.feed_forward.w2.weight")->pieces.front().file.find("pp_rank_01") != std::string::npos);

  // consolidate merges tp x pp: every tensor whole, equal to the trained one.
  fs::path const whole = scratch.path / "model.safetensors";
  (void)sw::consolidate(dir, whole);
  sw::safetensors_file file(whole.string());
  CHECK(file.tensors().size() == trained.size());
  for (auto const& [name, values] : trained) CHECK(file.read<float>(name) == values);

  for (bool lazy : {false, true}) {
    check_load(trained, dir, 1, 1, lazy);
    check_load(trained, dir, 1, 2, lazy);
    check_load(trained, dir, 1, 4, lazy);
    check_load(trained, dir, 2, 2, lazy);
    check_load(trained, dir, 4, 1, lazy);
    check_load(trained, dir, 4, 2, lazy);
  }

  // The plain (unstaged) Llama model loads it too: the names are the model's.
  models::Llama<float> plain(llama_pipeline_cases::config());
  auto const tp1 = sw::make_mesh<"tp">(sw::serial_world(), {1});
  (void)sw::load_sharded(plain, tp1, dir);
  sw::for_each_parameter(plain, [&](std::string const& name, auto const& p) {
    auto const t = sw::full_tensor(p);
    CHECK(std::vector<float>(t.data(), t.data() + t.size()) == trained.at(name));
  });
}

TEST_CASE("a pp 2 x tp 2 checkpoint saved asynchronously loads at pp 1, 2 and 4, any tp") {
  scratch_dir scratch;
  fs::path const dir = scratch.path / "ckpt";
  Tensors const trained = train_and_save(dir, false, true);
  CHECK(sw::read_checkpoint_index(dir).pp == 2);
  check_load(trained, dir, 1, 1, false);
  check_load(trained, dir, 2, 2, false);
  check_load(trained, dir, 4, 1, false);
}

TEST_CASE("a lazy stage reads only its own stage's files") {
  scratch_dir scratch;
  fs::path const dir = scratch.path / "ckpt";
  Tensors const trained = train_and_save(dir);
  // Damage every tensor byte of the second stage's files (their sizes stay): its checksums no longer match.
  for (int tp = 0; tp < 2; ++tp) {
    fs::path const f = dir / sw::rank_folder(tp, 1) / "model.safetensors";
    auto const size = fs::file_size(f);
    std::fstream out(f, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(static_cast<std::streamoff>(size - 64));
    std::vector<char> const noise(64, '\x5a');
    out.write(noise.data(), 64);
  }
  auto const tp1 = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const first = load_stage<sw::serial_plan>(tp1, dir, 2, 0, true, false, {});  // reads stage 0's files only
  for (auto const& [name, values] : first) CHECK(values == trained.at(name));
  CHECK(first.count("tok_embeddings.weight") == 1);
  CHECK(first.count("output.weight") == 0);
  CHECK_THROWS_WITH_AS(load_stage<sw::serial_plan>(tp1, dir, 2, 1, true, false, {}), doctest::Contains("checksum"),
                       sw::error);
}

TEST_CASE("tied embeddings over pp 2: saved once, under the embedding's name; loaded into both stages and at pp 1") {
  scratch_dir scratch;
  fs::path const dir = scratch.path / "ckpt";
  Tensors const trained = train_and_save(dir, true);
  REQUIRE(trained.size() == 2 + 9 * llama_pipeline_cases::config().layers);  // no output.weight: it is the table
  auto const index = sw::read_checkpoint_index(dir);
  CHECK(index.find("output.weight") == nullptr);
  REQUIRE(index.find("tok_embeddings.weight") != nullptr);
  CHECK(index.find("tok_embeddings.weight")->pieces.front().file.find("pp_rank_00") != std::string::npos);
  check_load(trained, dir, 1, 1, false, true);
  check_load(trained, dir, 2, 2, false, true);  // the last stage's output copy is read from the embedding's
  check_load(trained, dir, 4, 1, true, true);
  // One reader for the node: the first stage's first rank reads the other stage's tensors, and the copy, too.
  reading_ranks = 0;
  sw::detail::checkpoint_load_hook = count_reading_ranks;
  check_load(trained, dir, 2, 2, false, true, true);
  check_load(trained, dir, 4, 1, true, true, true);
  sw::detail::checkpoint_load_hook = nullptr;
  CHECK(reading_ranks.load() == 2);  // one per load
  models::Llama<float> plain(llama_pipeline_cases::config(true));
  auto const tp1 = sw::make_mesh<"tp">(sw::serial_world(), {1});
  (void)sw::load_sharded(plain, tp1, dir);
  auto const table = sw::full_tensor(std::get<0>(plain.tok_embeddings.parameters()));
  CHECK(std::vector<float>(table.data(), table.data() + table.size()) == trained.at("tok_embeddings.weight"));
}

namespace {
/// Trains `saved` 3 steps and saves it with the optimizer's state, then resumes at `resumed` for 3 more (tp: the
/// rest of 4 ranks); the resumed run must be the unsharded run that never stopped, steps 4 to 6, to the pipeline
/// tests' tolerances (llama_pipeline_cases::check_against_unsharded: losses 1e-4 relative, norms 1e-5,
/// parameters 2e-4 of their size plus their tensor's rms): fp32 sums in other orders, so not bit for bit.
template <class SavedPlan, class ResumedPlan>
void check_resumed(fs::path const& dir, llama_pipeline_cases::Setup const& saved, llama_pipeline_cases::Setup resumed) {
  INFO("saved at dp " << saved.dp << " x pp " << saved.pp << " x tp " << 4 / (saved.dp * saved.pp) << ", resumed at dp "
                      << resumed.dp << " x pp " << resumed.pp << " x tp " << 4 / (resumed.dp * resumed.pp));
  REQUIRE(saved.sequences() == resumed.sequences());  // the same batches
  auto const save = [&](auto& stage, auto const& tp, auto const& pp, auto const& dp, auto& optimizer) {
    sw::save_sharded(stage, optimizer, tp, pp, dp, dir, 3);
  };
  sw::run_threads(
      4, [&](auto& world) { (void)llama_pipeline_cases::train<SavedPlan>(world, saved, sw::OneFOneB{}, 3, save); });
  auto expected = llama_pipeline_cases::unsharded(saved, 6);
  expected.losses.erase(expected.losses.begin(), expected.losses.begin() + 3);
  expected.norms.erase(expected.norms.begin(), expected.norms.begin() + 3);
  auto const load = [&](auto& stage, auto const& tp, auto const&, auto const& dp, auto& optimizer) {
    CHECK(sw::load_sharded(stage, optimizer, tp, dp, dir).step == 3);
    CHECK(optimizer.steps() == 3);
  };
  resumed.first_step = 3;
  sw::run_threads(4, [&](auto& world) {
    auto const got = llama_pipeline_cases::train<ResumedPlan>(world, resumed, sw::OneFOneB{}, 3,
                                                              llama_pipeline_cases::nothing_after{}, load);
    auto const mesh = sw::make_mesh<"dp", "pp", "tp">(world, {resumed.dp, resumed.pp, 4 / (resumed.dp * resumed.pp)});
    llama_pipeline_cases::check_against_unsharded(sw::submesh<"pp">(mesh), got, expected);
  });
}
}  // namespace

TEST_CASE("a pipeline's optimizer state resumes at another dp x pp x tp: the run that never stopped") {
  scratch_dir scratch;
  using models::llama_plan;
  // pp 2 x tp 2 -> dp 2 (ZeRO-1) x pp 1 x tp 2; dp 2 (ZeRO-1) x pp 2 -> pp 4; pp 2 x tp 2 -> pp 4 (tp 1), tied too
  check_resumed<llama_plan<true>, llama_plan<true>>(scratch.path / "a", {.pp = 2, .microbatches = 2},
                                                    {.dp = 2, .microbatches = 1, .zero1 = true});
  check_resumed<sw::serial_plan, sw::serial_plan>(
      scratch.path / "b", {.dp = 2, .pp = 2, .microbatches = 1, .zero1 = true}, {.pp = 4, .microbatches = 2});
  check_resumed<llama_plan<true>, sw::serial_plan>(scratch.path / "c", {.pp = 2, .microbatches = 2},
                                                   {.pp = 4, .microbatches = 2});
  // Tied embeddings: the last stage's output is a copy of the first stage's table; its moments are the table's.
  check_resumed<llama_plan<true>, sw::serial_plan>(scratch.path / "d", {.pp = 2, .microbatches = 2, .tied = true},
                                                   {.pp = 4, .microbatches = 2, .tied = true});
}
