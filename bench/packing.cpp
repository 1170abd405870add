// Documents of different lengths trained packed (back to back, sw::sequence_lengths: each attends within itself)
// against padded to the longest (every document a row of the longest's length, the padding's targets -100, as a
// batch of padded rows is trained without packing): the same documents, the same tokens that count, one training
// step each (forward, llama_loss, backward, finish_gradients, AdamW), fp32, TP 1, one BLAS thread. Reports the
// median step time and the tokens/s of the documents' tokens (padding not counted), and the ratio. Both give the
// same loss (checked: a packing that changed the numbers fails the run).
//
// With --memory CAPACITY: a model built for CAPACITY positions (131,072, as a Llama 3.2 config.json gives) trained
// on rows of --longest tokens (4 of them): the process's peak resident set over what it held before the model,
// against what `shardwise plan` predicts for rows of that length. Run once per capacity (each its own process).
//
//   bench_packing [--dim 1024] [--layers 2] [--heads 16] [--kv-heads 8] [--hidden 2816] [--vocabulary 8192]
//                 [--longest 1024] [--documents 16] [--steps 3] [--memory CAPACITY] [--smoke]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/planner/llama.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "median.hpp"
#include "proc_status.hpp"

extern "C" void openblas_set_num_threads(int);

namespace sw = shardwise;
namespace models = shardwise::models;

namespace {

/// Document lengths with a long tail, as text corpora have: many short, a few as long as the longest; the first
/// is the longest, so padding pads to it. Deterministic.
std::vector<std::size_t> document_lengths(std::size_t count, std::size_t longest) {
  std::vector<std::size_t> lengths;
  for (std::size_t i = 0; i < count; ++i) {
    double const share = i == 0 ? 1.0 : std::pow(double((i * 7919) % count + 1) / double(count), 3.0);
    lengths.push_back(std::max<std::size_t>(8, std::size_t(share * double(longest))));
  }
  return lengths;
}

std::int64_t token(std::size_t document, std::size_t i, std::size_t vocabulary) {
  return std::int64_t((document * 104729 + i * 7919) % vocabulary);
}

struct Batch {
  std::vector<std::int64_t> ids, targets;
  sw::sequence_lengths rows;
};

/// The documents back to back, each with its own lengths; a document's last token predicts nothing (-100).
Batch packed(std::vector<std::size_t> const& lengths, std::size_t vocabulary) {
  Batch b;
  for (std::size_t d = 0; d < lengths.size(); ++d)
    for (std::size_t i = 0; i < lengths[d]; ++i) {
      b.ids.push_back(token(d, i, vocabulary));
      b.targets.push_back(i + 1 < lengths[d] ? token(d, i + 1, vocabulary) : -100);
    }
  b.rows = sw::sequence_lengths(lengths);
  return b;
}

/// Every document a row of the longest's length: its tokens, then padding (id 0, target -100).
Batch padded(std::vector<std::size_t> const& lengths, std::size_t vocabulary, std::size_t longest) {
  Batch b;
  for (std::size_t d = 0; d < lengths.size(); ++d)
    for (std::size_t i = 0; i < longest; ++i) {
      bool const real = i < lengths[d];
      b.ids.push_back(real ? token(d, i, vocabulary) : 0);
      b.targets.push_back(real && i + 1 < lengths[d] ? token(d, i + 1, vocabulary) : -100);
    }
  b.rows = sw::sequence_lengths::every(longest);
  return b;
}

struct Result {
  double seconds = 0, loss = 0;
};

/// `steps` training steps on the batch from the same initial model; the median step time and the first loss.
Result train(models::LlamaConfig const& c, Batch const& batch, int steps) {
  Result r;
  sw::run_threads(1, [&](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {1});
    auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
    models::Llama<float, models::llama_plan<true>> model(c);
    sw::parallelize(model, tp);
    sw::AdamW<float> optimizer({.learning_rate = 1e-4f, .max_grad_norm = 1.0f});
    std::vector<double> times;
    for (int step = 0; step <= steps; ++step) {  // the first is warm-up
      auto const start = std::chrono::steady_clock::now();
      auto const result = models::llama_loss(tp, model.forward(batch.ids, batch.rows), batch.targets, c.vocabulary);
      model.backward(result.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      if (step == 0) r.loss = result.loss;
      if (step > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    r.seconds = bench::median(times);
  });
  return r;
}

/// Two steps on 4 rows of `rows` tokens of a model built for `capacity` positions: the peak resident set over the
/// one before the model, against the planner's bytes per rank for rows of that length.
int memory(models::LlamaConfig c, std::size_t capacity, std::size_t rows) {
  double const before = bench::status_mib("VmRSS");
  std::size_t const sequences = 4;
  models::LlamaConfig planned_config = c;
  planned_config.sequence = rows;
  c.sequence = capacity;
  (void)train(c, padded(std::vector<std::size_t>(sequences, rows), c.vocabulary, rows), 1);  // warm-up and 1 step
  double const peak = bench::status_mib("VmHWM");
  namespace planner = sw::planner;
  double const planned =
      double(planner::estimate_layout(planned_config, {sequences, rows, planner::fp32}, {}, {}).bytes_per_rank()) /
      (1024.0 * 1024.0);
  std::printf("| %zu | %zu x %zu | %.1f | %.1f | %.3f |\n", capacity, sequences, rows, peak - before, planned,
              (peak - before) / planned);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);
  models::LlamaConfig c;
  c.vocabulary = 8192, c.dim = 1024, c.layers = 2, c.heads = 16, c.kv_heads = 8, c.hidden = 2816;
  std::size_t longest = 1024, documents = 16;
  int steps = 3;
  std::size_t capacity = 0;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto number = [&] { return i + 1 < argc ? std::size_t(std::atol(argv[++i])) : std::size_t(0); };
    if (a == "--dim")
      c.dim = number();
    else if (a == "--layers")
      c.layers = number();
    else if (a == "--heads")
      c.heads = number();
    else if (a == "--kv-heads")
      c.kv_heads = number();
    else if (a == "--hidden")
      c.hidden = number();
    else if (a == "--vocabulary")
      c.vocabulary = number();
    else if (a == "--longest")
      longest = number();
    else if (a == "--documents")
      documents = number();
    else if (a == "--steps")
      steps = int(number());
    else if (a == "--memory")
      capacity = number();
    else if (a == "--smoke")
      c.vocabulary = 64, c.dim = 32, c.layers = 1, c.heads = 4, c.kv_heads = 2, c.hidden = 64, longest = 32,
      documents = 5, steps = 1;
    else {
      std::fprintf(stderr,
                   "usage: bench_packing [--dim 1024] [--layers 2] [--heads 16] [--kv-heads 8] [--hidden 2816] "
                   "[--vocabulary 8192] [--longest 1024] [--documents 16] [--steps 3] [--memory CAPACITY] "
                   "[--smoke]\n");
      return 2;
    }
  }
  if (capacity != 0) {
    std::printf(
        "| capacity | rows | peak - before (MiB) | planned for the rows (MiB) | measured / planned |\n"
        "|---:|---|---:|---:|---:|\n");
    return memory(c, capacity, longest);
  }
  c.sequence = longest;
  auto const lengths = document_lengths(documents, longest);
  std::size_t tokens = 0;
  for (std::size_t n : lengths) tokens += n;
  Result const pack = train(c, packed(lengths, c.vocabulary), steps);
  Result const pad = train(c, padded(lengths, c.vocabulary, longest), steps);
  std::printf(
      "dim %zu, %zu layers, %zu/%zu heads, hidden %zu, vocabulary %zu; %zu documents of %zu..%zu tokens, "
      "%zu in all (padded: %zu)\n\n",
      c.dim, c.layers, c.heads, c.kv_heads, c.hidden, c.vocabulary, documents,
      *std::min_element(lengths.begin(), lengths.end()), longest, tokens, documents * longest);
  std::printf("| batch | step (ms) | document tokens/s | loss |\n|---|---|---|---|\n");
  std::printf("| padded to the longest | %.1f | %.0f | %.6f |\n", 1e3 * pad.seconds, double(tokens) / pad.seconds,
              pad.loss);
  std::printf("| **packed** | %.1f | %.0f | %.6f |\n", 1e3 * pack.seconds, double(tokens) / pack.seconds, pack.loss);
  std::printf("\npacked / padded tokens/s: **%.2f**\n", pad.seconds / pack.seconds);
  double const difference = std::abs(pack.loss - pad.loss) / std::abs(pad.loss);
  if (difference > 1e-4) {
    std::fprintf(stderr, "bench_packing: WRONG: packed loss %.7f, padded %.7f\n", pack.loss, pad.loss);
    return 1;
  }
  return 0;
}
