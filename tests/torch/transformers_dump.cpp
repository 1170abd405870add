// The C++ half of the outside check against Hugging Face transformers for tied word embeddings: shardwise's
// Llama with tie_word_embeddings, the same model as a Qwen2 (biases on q, k and v, a yarn rotary scaling) and its
// GPT-2 model (always tied), each unsharded and at TP 1, 2 and 4 on the
// thread mesh (transformers_dump DIR), or at TP n on MPI (mpiexec -n n transformers_dump --mpi DIR). Per model
// it writes the initial weights under transformers' names (GPT-2: q, k, v fused into c_attn and every Linear
// transposed, as GPT2LMHeadModel's Conv1D stores [in, out]), and per run the logits and loss of one batch, every
// parameter's gradient after that backward (finished, gathered whole), and the losses and global gradient norms
// of 5 AdamW steps that all clip. transformers_reference.py recomputes all of it with transformers and
// torch.optim and compares; it shares no code with this file.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "npy.hpp"
#ifndef SHARDWISE_DUMP_WITHOUT_MPI
#include <shardwise/mesh/mpi/comm.hpp>
#endif

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

constexpr int steps = 5;

/// The optimizer both sides use: max_grad_norm below every step's norm (transformers_reference.py checks it),
/// and no weight decay for biases and norm weights (torch.optim.AdamW with two parameter groups there).
sw::AdamWOptions<float> adamw() {
  return {
      .learning_rate = 1e-2f,
      .beta1 = 0.9f,
      .beta2 = 0.95f,
      .eps = 1e-8f,
      .weight_decay = 0.1f,
      .max_grad_norm = 0.05f,
      .groups = {{.matches = sw::names_matching({"*.bias", "*norm.weight", "*ln_*.weight"}), .weight_decay = 0.0f}}};
}

/// Two sequences of 8 tokens (the same formula as llama_dump.cpp and the Python side).
std::vector<std::int64_t> ids_of(int step, bool targets) {
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 16; ++i) ids.push_back((step * 31 + i * 7 + (targets ? 3 : 0)) % 64);
  return ids;
}

/// A whole tensor, row-major, as .npy writes it.
struct Tensor {
  std::vector<long> shape;
  std::vector<double> data;
};
using Tensors = std::map<std::string, Tensor>;

template <class Dense>
Tensor tensor_of(Dense const& m) {
  Tensor t;
  if (Dense::ColsAtCompileTime == 1)
    t.shape = {long(m.rows())};
  else
    t.shape = {long(m.rows()), long(m.cols())};
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) t.data.push_back(double(m(i, j)));
  return t;
}

Tensor transposed(Tensor const& t) {
  Tensor out{{t.shape[1], t.shape[0]}, std::vector<double>(t.data.size())};
  for (long i = 0; i < t.shape[0]; ++i)
    for (long j = 0; j < t.shape[1]; ++j)
      out.data[std::size_t(j * t.shape[0] + i)] = t.data[std::size_t(i * t.shape[1] + j)];
  return out;
}

/// [in, a] [in, b] [in, c] side by side (matrices), or one after another (vectors): Conv1D's fused c_attn.
Tensor concatenated(std::vector<Tensor> const& parts) {
  Tensor out = parts.front();
  if (out.shape.size() == 1) {
    for (std::size_t k = 1; k < parts.size(); ++k) {
      out.data.insert(out.data.end(), parts[k].data.begin(), parts[k].data.end());
      out.shape[0] += parts[k].shape[0];
    }
    return out;
  }
  long const rows = out.shape[0];
  out.shape[1] = 0;
  for (auto const& p : parts) out.shape[1] += p.shape[1];
  out.data.clear();
  for (long i = 0; i < rows; ++i)
    for (auto const& p : parts)
      out.data.insert(out.data.end(), p.data.begin() + i * p.shape[1], p.data.begin() + (i + 1) * p.shape[1]);
  return out;
}

std::string replaced(std::string name, std::vector<std::pair<std::string, std::string>> const& rules) {
  for (auto const& [from, to] : rules)
    if (auto at = name.find(from); at != std::string::npos) name.replace(at, from.size(), to);
  return name;
}

/// LlamaForCausalLM's names; the tied lm_head is not a tensor of its own.
struct LlamaSpec {
  static constexpr char const* name = "llama";
  template <class Plan>
  using model = models::Llama<float, Plan>;
  using sp_plan = models::llama_plan<true>;
  using tp_plan = models::llama_plan<false>;
  static models::LlamaConfig config() {
    models::LlamaConfig c;
    c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
    c.norm_eps = 1e-5, c.rope_theta = 10000.0, c.tie_word_embeddings = true;
    return c;
  }
  template <class Mesh, class Logits>
  static auto loss(Mesh const& tp, Logits const& logits, std::vector<std::int64_t> const& targets) {
    return models::llama_loss(tp, logits, targets, config().vocabulary);
  }
  static Tensors hf(Tensors const& ours) {
    Tensors out;
    for (auto const& [name, t] : ours)
      out["model." + replaced(name, {{"tok_embeddings", "embed_tokens"},
                                     {"attention_norm", "input_layernorm"},
                                     {"ffn_norm", "post_attention_layernorm"},
                                     {"attention.wq", "self_attn.q_proj"},
                                     {"attention.wk", "self_attn.k_proj"},
                                     {"attention.wv", "self_attn.v_proj"},
                                     {"attention.wo", "self_attn.o_proj"},
                                     {"feed_forward.w1", "mlp.gate_proj"},
                                     {"feed_forward.w3", "mlp.up_proj"},
                                     {"feed_forward.w2", "mlp.down_proj"}})] = t;
    return out;
  }
};

/// Qwen2ForCausalLM (Qwen2.5's small models): Llama's blocks with biases on q, k and v, tied, and here a yarn
/// rotary scaling whose ramp falls between column pairs and whose attention factor scales cos and sin. The same
/// C++ type as LlamaSpec's model: only the configuration differs.
struct Qwen2Spec : LlamaSpec {
  static constexpr char const* name = "qwen2";
  static models::LlamaConfig config() {
    models::LlamaConfig c = LlamaSpec::config();
    c.norm_eps = 1e-6, c.attention_bias = true;
    c.rope_scaling = {.type = models::rope_type::yarn, .factor = 4, .original_max_positions = 64, .truncate = false};
    return c;
  }
  template <class Mesh, class Logits>
  static auto loss(Mesh const& tp, Logits const& logits, std::vector<std::int64_t> const& targets) {
    return models::llama_loss(tp, logits, targets, config().vocabulary);
  }
};

/// GPT2LMHeadModel's names: "transformer." before ours, q/k/v fused into c_attn, Linear weights transposed
/// (Conv1D: [in, out]); the tied lm_head is not a tensor of its own.
struct GPT2Spec {
  static constexpr char const* name = "gpt2";
  template <class Plan>
  using model = models::GPT2<float, Plan>;
  using sp_plan = models::gpt2_plan<true>;
  using tp_plan = models::gpt2_plan<false>;
  static models::GPT2Config config() {
    models::GPT2Config c;
    c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.sequence = 8, c.layer_norm_eps = 1e-5;
    return c;
  }
  template <class Mesh, class Logits>
  static auto loss(Mesh const& tp, Logits const& logits, std::vector<std::int64_t> const& targets) {
    return models::gpt2_loss(tp, logits, targets, config().vocabulary);
  }
  static Tensors hf(Tensors const& ours) {
    Tensors out;
    for (auto const& [name, t] : ours) {
      bool const linear_weight = name.ends_with("proj.weight") || name.ends_with("c_fc.weight");
      if (name.find("q_proj") != std::string::npos) {  // c_attn = [q | k | v] along the outputs
        std::string const k = replaced(name, {{"q_proj", "k_proj"}}), v = replaced(name, {{"q_proj", "v_proj"}});
        std::vector<Tensor> parts{t, ours.at(k), ours.at(v)};
        if (linear_weight)
          for (auto& p : parts) p = transposed(p);
        out["transformer." + replaced(name, {{"q_proj", "c_attn"}})] = concatenated(parts);
      } else if (name.find("k_proj") == std::string::npos && name.find("v_proj") == std::string::npos) {
        out["transformer." + name] = linear_weight ? transposed(t) : t;
      }
    }
    return out;
  }
};

void write_all(Tensors const& tensors, fs::path const& dir) {
  fs::create_directories(dir);
  for (auto const& [name, t] : tensors) npy::write(dir / (name + ".npy"), t.data.data(), t.shape);
}

/// Every parameter's value, gathered whole under shardwise's names (collective).
template <class Model>
Tensors values_of(Model& model) {
  Tensors out;
  sw::for_each_parameter(model,
                         [&](std::string const& name, auto const& p) { out[name] = tensor_of(sw::full_tensor(p)); });
  return out;
}

/// Every finished gradient, gathered whole under shardwise's names (collective).
template <class Finished>
Tensors gradients_of(Finished finished) {
  Tensors out;
  sw::for_each_parameter(finished,
                         [&](std::string const& name, auto const& p) { out[name] = tensor_of(sw::full_gradient(p)); });
  return out;
}

/// One run: the logits, loss and gradients of batch 0, then the 5 steps' losses and norms, written by rank 0
/// into dir/<model>/<tag>/. With weights set, the initial weights too (dir/<model>/weights/).
template <class Spec, class Plan, class World>
void run(World const& world, fs::path const& dir, std::string const& tag, bool weights) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  typename Spec::template model<Plan> model(Spec::config());
  sw::AdamW<float> optimizer(adamw());
  sw::parallelize(model, tp);
  fs::path const out = dir / Spec::name / tag;
  bool const writer = world.rank() == 0;
  if (weights) {
    auto const initial = Spec::hf(values_of(model));
    if (writer) write_all(initial, dir / Spec::name / "weights");
  }
  Eigen::Matrix<double, Eigen::Dynamic, 1> losses(steps), norms(steps);
  for (int step = 0; step < steps; ++step) {
    auto const logits = model.forward(ids_of(step, false));
    auto const result = Spec::loss(tp, logits, ids_of(step, true));
    model.backward(result.dlogits);
    auto finished = sw::finish_gradients(model);
    if (step == 0) {
      sw::nn::matrix<float> whole = logits.local;
      if constexpr (!std::is_same_v<typename std::remove_cvref_t<decltype(logits)>::placement, sw::Replicate>)
        sw::all_gather(tp, logits.local, whole, -1);  // vocabulary-sharded logits, whole
      auto const gradients = Spec::hf(gradients_of(finished));
      if (writer) {
        write_all(gradients, out / "grad");
        npy::write(out / "logits.npy", whole);
        npy::write(out / "loss.npy", Eigen::Matrix<double, 1, 1>::Constant(result.loss));
      }
    }
    norms(step) = optimizer.step(finished, dp);
    sw::zero_grad(model);
    losses(step) = result.loss;
  }
  if (writer) {
    npy::write(out / "losses.npy", losses);
    npy::write(out / "norms.npy", norms);
  }
}

template <class Spec>
void on_threads(fs::path const& dir) {
  sw::run_threads(1, [&](auto& world) { run<Spec, sw::serial_plan>(world, dir, "unsharded", true); });
  sw::run_threads(1, [&](auto& world) { run<Spec, typename Spec::sp_plan>(world, dir, "tp1", false); });
  sw::run_threads(2, [&](auto& world) { run<Spec, typename Spec::tp_plan>(world, dir, "tp2", false); });
  sw::run_threads(4, [&](auto& world) { run<Spec, typename Spec::sp_plan>(world, dir, "tp4", false); });
}

/// On MPI, TP 2 without sequence parallelism and TP 4 with it (the thread runs' plans at those sizes); the
/// initial weights are gathered from the sharded model (sw::full_tensor).
template <class Spec>
void on_mpi(fs::path const& dir) {
#ifdef SHARDWISE_DUMP_WITHOUT_MPI
  (void)dir;
  throw sw::error("transformers_dump: built without MPI (Boost.MPI/OpenMPI not found)");
#else
  auto const world = sw::mpi_world();
  std::string const tag = "mpi" + std::to_string(world.size());
  if (world.size() == 2)
    run<Spec, typename Spec::tp_plan>(world, dir, tag, true);
  else
    run<Spec, typename Spec::sp_plan>(world, dir, tag, true);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  bool const mpi = argc == 3 && std::strcmp(argv[1], "--mpi") == 0;
  if (argc != 2 && !mpi) {
    std::fprintf(stderr, "usage: transformers_dump OUTPUT_DIR | mpiexec -n 2|4 transformers_dump --mpi OUTPUT_DIR\n");
    return 2;
  }
  fs::path const dir = argv[argc - 1];
  if (mpi) {
    on_mpi<LlamaSpec>(dir);
    on_mpi<Qwen2Spec>(dir);
    on_mpi<GPT2Spec>(dir);
  } else {
    on_threads<LlamaSpec>(dir);
    on_threads<Qwen2Spec>(dir);
    on_threads<GPT2Spec>(dir);
  }
  std::puts("transformers_dump: written");
  return 0;
}
