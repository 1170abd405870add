// Checkpoints that do not stop training: every 5 steps save_sharded copies each rank's shard into memory and
// returns; a background thread per rank writes it while the next steps run, and poll() commits the save as soon
// as every rank has written its part. At the end the last checkpoint is loaded back into a fresh model.
//
//   ./async_checkpoint [folder]        # 4 ranks on threads, TP 4
//   mpiexec -n 2 ./async_checkpoint    # the same on 2 MPI processes
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <shardwise/checkpoint/async_save.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;
using Model = models::Llama<float, models::llama_plan<false>>;

/// Every parameter's bytes, in order.
std::vector<char> parameter_bytes(Model& model) {
  std::vector<char> all;
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) {
    auto const* bytes = reinterpret_cast<char const*>(p.value->data());
    all.insert(all.end(), bytes, bytes + p.value->size() * sizeof(float));
  });
  return all;
}

int main(int argc, char** argv) {
  std::filesystem::path const dir =
      argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path() / "shardwise_async_example";
  models::LlamaConfig config;
  config.vocabulary = 64, config.dim = 64, config.layers = 2, config.heads = 4, config.kv_heads = 2;
  config.hidden = 128, config.sequence = 16;

  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, world.size()});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    Model model(config);
    sw::parallelize(model, tp);
    sw::AdamW<float> optimizer({.learning_rate = 1e-2f});
    sw::async_save saver;  // after the mesh, which it uses to agree and commit; its destructor waits too

    std::vector<std::int64_t> ids(4 * config.sequence), targets(ids.size());
    int saves = 0;
    for (int step = 1; step <= 20; ++step) {
      for (std::size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<std::int64_t>((step * 7 + i * 13) % config.vocabulary);
        targets[i] = static_cast<std::int64_t>((step * 7 + i * 13 + 5) % config.vocabulary);
      }
      auto const logits = model.forward(ids);
      auto const result = models::llama_loss(tp, logits, targets, config.vocabulary);
      model.backward(result.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      if (step % 5 == 0) {
        sw::save_sharded(model, tp, dir / "ckpt", step, saver);  // copies this rank's shard, then returns
        ++saves;
      }
      saver.poll();  // collective: commits the save in flight once every rank has written it
    }
    saver.wait();  // the last save committed; a failure on any rank is raised here, on every rank

    auto fresh = config;
    fresh.seed = 999;  // other weights until loaded
    Model loaded(fresh);
    sw::parallelize(loaded, tp);
    auto const index = sw::load_sharded(loaded, tp, dir / "ckpt");
    int const same = sw::all_reduce(tp, parameter_bytes(loaded) == parameter_bytes(model) ? 1 : 0, sw::Min{});
    sw::barrier(tp);
    if (world.rank() != 0) return;
    std::filesystem::remove_all(dir);
    std::printf("%s on %d ranks: %d saves written in the background; step %lld loaded back %s\n",
                sw::launched_by_mpi() ? "MPI" : "threads", world.size(), saves, static_cast<long long>(index.step),
                same ? "bit for bit  ok" : "WRONG: it differs from the model saved");
    if (!same) exit_code = 1;
  });
  return exit_code;
}
