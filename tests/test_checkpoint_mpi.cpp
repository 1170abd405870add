// Sharded checkpoints on the MPI mesh (run by CTest under mpiexec at 2 and 4 processes): saved at TP = world
// size, loaded at every TP size that divides it (dp x tp meshes), the logits equal to the unsharded model's; a
// round trip at TP 1 (dp = world size) giving back the parameters bit for bit; a save from one data-parallel
// replica; an error on rank 0 raised with its words on every process; experts placed over ep = every process saved
// and loaded at ep 1 and back.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/mesh/mpi/comm.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "cases/expert_checkpoint_cases.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

models::LlamaConfig config() {
  models::LlamaConfig c;
  c.vocabulary = 62, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
  return c;
}

std::vector<std::int64_t> some_ids() {
  std::vector<std::int64_t> ids;
  for (int t = 0; t < 16; ++t) ids.push_back((t * 37 + 5) % 62);
  return ids;
}

/// A folder all processes name alike (one per world size, so runs at 2 and 4 processes do not meet).
fs::path shared_dir(int world_size) {
  return fs::current_path() / ("checkpoint_mpi_test_" + std::to_string(world_size));
}

template <class Plan, class Mesh>
void check_logits(Mesh const& mesh, fs::path const& dir, sw::nn::matrix<float> const& expected, std::int64_t step,
                  sw::load_options const& options = {}) {
  auto const tp = sw::submesh<"tp">(mesh);
  auto c = config();
  c.seed = 999;  // other weights until loaded
  models::Llama<float, Plan> model(c);
  sw::parallelize(model, tp);
  auto const index = sw::load_sharded(model, tp, dir, options);
  CHECK(index.step == step);
  auto const logits = model.forward(some_ids());
  sw::nn::matrix<float> all;
  sw::all_gather(tp, logits.local, all, -1);
  sw::nn::matrix<float> const got = all.leftCols(62);
  REQUIRE(got.rows() == expected.rows());
  REQUIRE(got.cols() == expected.cols());
  CHECK((got - expected).cwiseAbs().maxCoeff() <= 1e-5f * expected.cwiseAbs().maxCoeff());
}

/// Every parameter's bytes, in traversal order: equal strings are bit-identical parameters.
template <class Model>
std::vector<std::string> parameter_bytes(Model& model) {
  std::vector<std::string> all;
  sw::detail::for_each_parameter(model, [&](auto const& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::tensor_type::Scalar;
    all.emplace_back(reinterpret_cast<char const*>(p.value->data()),
                     static_cast<std::size_t>(p.value->size()) * sizeof(T));
  });
  return all;
}

}  // namespace

TEST_CASE("MPI: a round trip at TP 1 (dp = world size) gives back the parameters bit for bit") {
  auto const world = sw::mpi_world();
  int const n = world.size();
  fs::path const dir = shared_dir(n) / "tp1";
  if (world.rank() == 0) fs::create_directories(dir.parent_path());
  world.barrier();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {n, 1});
  auto const tp = sw::submesh<"tp">(mesh);
  REQUIRE(tp.size() == 1);
  models::Llama<float, models::llama_plan<false>> saved(config());
  sw::parallelize(saved, tp);
  if (sw::submesh<"dp">(mesh).rank() == 0) sw::save_sharded(saved, tp, dir, 21);
  world.barrier();

  auto other = config();
  other.seed = 999;  // other weights until loaded
  models::Llama<float, models::llama_plan<false>> loaded(other);
  sw::parallelize(loaded, tp);
  auto const expected = parameter_bytes(saved);
  REQUIRE(parameter_bytes(loaded) != expected);  // the load has something to do
  auto const index = sw::load_sharded(loaded, tp, dir);
  CHECK(index.step == 21);
  CHECK(index.tp == 1);
  auto const got = parameter_bytes(loaded);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK_MESSAGE(got[i] == expected[i], "parameter " << i);
  world.barrier();
  if (world.rank() == 0) fs::remove_all(shared_dir(n));
}

TEST_CASE("MPI: saved at TP = world size, loaded at every TP size that divides it") {
  auto const world = sw::mpi_world();
  int const n = world.size();
  models::Llama<float> reference(config());
  sw::nn::matrix<float> const expected = reference.forward(some_ids()).local;
  fs::path const dir = shared_dir(n) / "ckpt";
  if (world.rank() == 0) fs::create_directories(dir.parent_path());
  world.barrier();

  auto const flat = sw::make_mesh<"dp", "tp">(world, {1, n});
  {
    auto const tp = sw::submesh<"tp">(flat);
    models::Llama<float, models::llama_plan<false>> model(config());
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, dir, 11);
  }
  world.barrier();
  for (int tp_size = 1; tp_size <= n; tp_size *= 2) {
    INFO("loading at dp " << n / tp_size << " x tp " << tp_size);
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {n / tp_size, tp_size});
    check_logits<models::llama_plan<false>>(mesh, dir, expected, 11);
    check_logits<models::llama_plan<true>>(mesh, dir, expected, 11);
    check_logits<models::llama_plan<false>>(mesh, dir, expected, 11, {.only_rank0_reads = true});  // sent over MPI
    sw::load_options node_reads{.only_rank0_reads = true};  // the host's first process reads for all of them
    node_reads.turns = sw::node_turns(world);
    check_logits<models::llama_plan<false>>(mesh, dir, expected, 11, node_reads);
    check_logits<models::llama_plan<false>>(mesh, dir, expected, 11, {.ranks_per_step = 1});
  }

  // Saved from one data-parallel replica of a dp 2 x tp n/2 mesh with sequence parallelism, loaded at tp n.
  auto const grid = sw::make_mesh<"dp", "tp">(world, {2, n / 2});
  if (sw::submesh<"dp">(grid).rank() == 0) {
    auto const tp = sw::submesh<"tp">(grid);
    models::Llama<float, models::llama_plan<true>> model(config());
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, dir, 12);
  }
  world.barrier();
  check_logits<models::llama_plan<false>>(flat, dir, expected, 12);
  world.barrier();
  if (world.rank() == 0) fs::remove_all(shared_dir(n));
}

TEST_CASE("MPI: a save that fails on rank 0 fails on every process with rank 0's words") {
  auto const world = sw::mpi_world();
  int const n = world.size();
  fs::path const dir = shared_dir(n) / "not_a_checkpoint";
  if (world.rank() == 0) {
    fs::create_directories(dir);
    std::ofstream(dir / "notes.txt") << "keep me";
  }
  world.barrier();
  auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {n}));
  models::Llama<float, models::llama_plan<false>> model(config());
  sw::parallelize(model, tp);
  std::string message;
  try {
    sw::save_sharded(model, tp, dir, 1);
  } catch (sw::error const& e) {
    message = e.what();
  }
  CHECK(message.find("not_a_checkpoint\" exists and is not a shardwise checkpoint") != std::string::npos);
  if (world.rank() != 0) CHECK(message.find("[reported by tp rank 0]") != std::string::npos);
  world.barrier();
  if (world.rank() == 0) {
    CHECK(fs::exists(dir / "notes.txt"));
    fs::remove_all(shared_dir(n));
  }
}

namespace {
int process_rank = -1;
bool saved_meanwhile = false;
fs::path meanwhile_dir;
}  // namespace

TEST_CASE("MPI: a save between two tp groups' reads on one node: every process reads the new save") {
  auto const world = sw::mpi_world();
  int const n = world.size();
  if (n != 4) return;                           // two tp groups of two, sharing the node's turns
  world.set_timeout(std::chrono::seconds(20));  // a process retrying alone would wait this long, then fail
  fs::path const dir = shared_dir(n) / "replaced_while_read";
  if (world.rank() == 0) fs::create_directories(dir.parent_path());
  world.barrier();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
  auto const tp = sw::submesh<"tp">(mesh);
  {
    models::Llama<float, models::llama_plan<false>> model(config());
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, dir, 21);
  }
  world.barrier();
  // The last process of the node to read saves the checkpoint again (serially) as its turn starts: its tp group
  // finds the folder replaced and reads again, and so must the other group, which shares the node's turns.
  process_rank = world.rank(), saved_meanwhile = false, meanwhile_dir = dir;
  sw::detail::checkpoint_load_hook = [](std::string_view stage, int) {
    if (stage != "read_begin" || process_rank != 3 || saved_meanwhile) return;
    saved_meanwhile = true;
    auto const one = sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1}));
    models::Llama<float, models::llama_plan<false>> model(config());
    sw::parallelize(model, one);
    sw::save_sharded(model, one, meanwhile_dir, 22);
  };
  sw::load_options options{.ranks_per_step = 1};
  options.turns = sw::node_turns(world);  // one host: the four processes
  std::int64_t step = 0;
  std::string message;
  try {
    auto c = config();
    c.seed = 999;
    models::Llama<float, models::llama_plan<false>> model(c);
    sw::parallelize(model, tp);
    step = sw::load_sharded(model, tp, dir, options).step;
  } catch (sw::error const& e) {
    message = e.what();
  }
  sw::detail::checkpoint_load_hook = nullptr;
  INFO("process " << world.rank() << ": " << message);
  CHECK(step == 22);
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

TEST_CASE(
    "MPI: experts placed over ep = every process (and dp 2 x tp 2) save with their optimizer and load elsewhere") {
  auto const world = sw::mpi_world();
  fs::path const dir = shared_dir(world.size()) / "experts";
  if (world.rank() == 0) fs::create_directories(dir);
  world.barrier();
  expert_checkpoint_cases::check_expert_checkpoints(world, dir);
  if (world.size() == 4) expert_checkpoint_cases::check_expert_tp_checkpoint(world, dir);
  world.barrier();
  if (world.rank() == 0) fs::remove_all(shared_dir(world.size()));
}
