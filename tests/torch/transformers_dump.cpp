// The C++ half of the training check against Hugging Face transformers, in fp64: shardwise's Llama as each family
// users hold (Llama 3.2-like: llama3 rotary scaling, tied; Llama 3.1-like: untied, 4 query heads per key-value
// head; Qwen2.5-like: biases on q, k and v, tied, yarn; Qwen3-like: q and k norms, heads of 16 on a width of 32;
// Mistral-like: a sliding window of 3 on rows of 8; SmolLM2-like: 9 heads, 3 key-value heads, tied) and its GPT-2
// model, each unsharded and at TP 1 and at 2 and 4 (SmolLM2: 3) with and without sequence parallelism on the thread
// mesh (transformers_dump DIR), or at TP n on MPI (mpiexec -n n transformers_dump --mpi DIR; SmolLM2's heads
// serve neither 2 nor 4). Per model it writes the initial weights under transformers' names (GPT-2: q, k, v fused
// into c_attn and every Linear transposed, as GPT2LMHeadModel's Conv1D stores [in, out]), and per run the logits
// and loss of one batch, every parameter's gradient after that backward (finished, gathered whole), and the losses
// and global gradient norms of 5 AdamW steps that all clip. transformers_reference.py recomputes all of it with
// transformers and torch.optim and compares; it shares no code with this file.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <shardwise/checkpoint/peft.hpp>
#include <shardwise/context.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
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

using real = double;  // fp64 on both sides: what differs is the order of sums

/// The optimizer both sides use: max_grad_norm below every step's norm (transformers_reference.py checks it),
/// and no weight decay for biases and norm weights (torch.optim.AdamW with two parameter groups there).
sw::AdamWOptions<real> adamw() {
  return {.learning_rate = 1e-2,
          .beta1 = 0.9,
          .beta2 = 0.95,
          .eps = 1e-8,
          .weight_decay = 0.1,
          .max_grad_norm = 0.05,
          .groups = {{.matches = sw::names_matching({"*.bias", "*norm.weight", "*ln_*.weight"}), .weight_decay = 0.0}}};
}

/// adamw() under a schedule (warm-up 2, then a cosine to a tenth over 5 steps), with the no-decay group at half
/// the learning rate: what the "schedule_*" runs train with (transformers' cosine_with_min_lr there).
sw::AdamWOptions<real> scheduled_adamw() {
  auto options = adamw();
  options.schedule = {.kind = sw::schedule_kind::cosine, .warmup_steps = 2, .total_steps = 5, .min_lr_rate = 0.1};
  options.groups.front().learning_rate = 5e-3;
  return options;
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

/// Llama 3.2-like (the llama3 rotary scaling, tied) under LlamaForCausalLM's names; the tied lm_head is not a
/// tensor of its own. The other Llama-type families are the same C++ type with another configuration (and the
/// same vocabulary of 64, which the loss reads).
struct LlamaSpec {
  static constexpr char const* name = "llama";
  template <class Plan>
  using model = models::Llama<real, Plan>;
  using sp_plan = models::llama_plan<true>;
  using tp_plan = models::llama_plan<false>;
  static std::vector<int> tp_sizes() { return {2, 4}; }  // on threads, beside 1
  static constexpr bool layouts = false;                 // FSDP, pp and cp against transformers too
  static models::LlamaConfig config() {
    models::LlamaConfig c;
    c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
    c.norm_eps = 1e-5, c.rope_theta = 10000.0, c.tie_word_embeddings = true;
    c.rope_scaling = {.type = models::rope_type::llama3, .factor = 8, .original_max_positions = 16};
    return c;
  }
  template <class Mesh, class Logits>
  static auto loss(Mesh const& tp, Logits const& logits, std::vector<std::int64_t> const& targets) {
    return models::llama_loss(tp, logits, targets, config().vocabulary);
  }
  static Tensors hf(Tensors const& ours) {  // the library's names, which the Python side loads strictly
    Tensors out;
    for (auto const& [name, t] : ours) out[sw::transformers_llama_name(name)] = t;
    return out;
  }
};

/// Qwen2ForCausalLM (Qwen2.5's small models): Llama's blocks with biases on q, k and v, tied, and here a yarn
/// rotary scaling whose ramp falls between column pairs and whose attention factor scales cos and sin. The same
/// C++ type as LlamaSpec's model: only the configuration differs.
struct Qwen2Spec : LlamaSpec {
  static constexpr char const* name = "qwen2";
  static constexpr bool layouts = true;
  static models::LlamaConfig config() {
    models::LlamaConfig c = LlamaSpec::config();
    c.norm_eps = 1e-6, c.attention_bias = true;
    c.rope_scaling = {.type = models::rope_type::yarn, .factor = 4, .original_max_positions = 64, .truncate = false};
    return c;
  }
};

/// Qwen2 with its window on the layers from max_window_layers on: a window of 3 on the second layer.
struct Qwen2WindowSpec : Qwen2Spec {
  static constexpr char const* name = "qwen2_window";
  static constexpr bool layouts = false;
  static models::LlamaConfig config() {
    models::LlamaConfig c = Qwen2Spec::config();
    c.sliding_window = 3, c.first_window_layer = 1;
    return c;
  }
};

/// Llama 3.1-like: untied, 8 query heads over 2 key-value heads (repeated at TP 4), the llama3 scaling.
struct Llama31Spec : LlamaSpec {
  static constexpr char const* name = "llama31";
  static models::LlamaConfig config() {
    models::LlamaConfig c = LlamaSpec::config();
    c.heads = 8, c.tie_word_embeddings = false, c.rope_theta = 500000.0;
    return c;
  }
};

/// Qwen3ForCausalLM (Qwen3-0.6B's shape, scaled down): q and k norms, 4 heads of 16 on a width of 32, tied.
struct Qwen3Spec : LlamaSpec {
  static constexpr char const* name = "qwen3";
  static constexpr bool layouts = true;
  static models::LlamaConfig config() {
    models::LlamaConfig c = LlamaSpec::config();
    c.qk_norm = true, c.explicit_head_dim = 16, c.norm_eps = 1e-6, c.rope_theta = 1000000.0, c.rope_scaling = {};
    return c;
  }
};

/// MistralForCausalLM: a sliding window of 3 tokens on rows of 8, untied.
struct MistralSpec : LlamaSpec {
  static constexpr char const* name = "mistral";
  static constexpr bool layouts = true;
  static models::LlamaConfig config() {
    models::LlamaConfig c = LlamaSpec::config();
    c.sliding_window = 3, c.tie_word_embeddings = false, c.rope_scaling = {};
    return c;
  }
};

/// SmolLM2-like (a LlamaForCausalLM): 9 heads of 4 and 3 key-value heads, tied; tp 3 serves them, 2 and 4 do not.
struct SmolSpec : LlamaSpec {
  static constexpr char const* name = "smollm";
  static constexpr bool layouts = true;
  static std::vector<int> tp_sizes() { return {3}; }
  static models::LlamaConfig config() {
    models::LlamaConfig c = LlamaSpec::config();
    c.dim = 36, c.heads = 9, c.kv_heads = 3, c.hidden = 48, c.rope_scaling = {};
    return c;
  }
};

/// A LlamaForCausalLM with attention_bias (q, k, v and o) and mlp_bias (gate, up and down), untied.
struct LlamaBiasSpec : LlamaSpec {
  static constexpr char const* name = "llama_bias";
  static constexpr bool layouts = true;
  static models::LlamaConfig config() {
    models::LlamaConfig c = LlamaSpec::config();
    c.attention_bias = c.attention_output_bias = c.mlp_bias = true, c.tie_word_embeddings = false;
    c.rope_scaling = {};
    return c;
  }
};

/// GPT2LMHeadModel's names: "transformer." before ours, q/k/v fused into c_attn, Linear weights transposed
/// (Conv1D: [in, out]); the tied lm_head is not a tensor of its own.
struct GPT2Spec {
  static constexpr char const* name = "gpt2";
  template <class Plan>
  using model = models::GPT2<real, Plan>;
  using sp_plan = models::gpt2_plan<true>;
  using tp_plan = models::gpt2_plan<false>;
  static std::vector<int> tp_sizes() { return {2, 4}; }
  static constexpr bool layouts = false;
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
void run(World const& world, fs::path const& dir, std::string const& tag, bool weights,
         sw::AdamWOptions<real> const& options = adamw()) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  typename Spec::template model<Plan> model(Spec::config());
  sw::AdamW<real> optimizer(options);
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
      sw::nn::matrix<real> whole = logits.local;
      if constexpr (!std::is_same_v<typename std::remove_cvref_t<decltype(logits)>::placement, sw::Replicate>)
        sw::all_gather(tp, logits.local, whole, -1);                           // vocabulary-sharded logits, whole
      whole = whole.leftCols(Eigen::Index(Spec::config().vocabulary)).eval();  // the padding for tp left out
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

/// A run's 5 steps' losses and clipped norms, written by rank 0 into dir/<model>/<tag>/ (what the layouts that
/// cut the batch or the model into pieces are compared on).
template <class Spec>
void write_steps(bool writer, fs::path const& dir, std::string const& tag, std::vector<double> const& losses,
                 std::vector<double> const& norms) {
  if (!writer) return;
  fs::create_directories(dir / Spec::name / tag);
  npy::write(dir / Spec::name / tag / "losses.npy", Eigen::Map<Eigen::VectorXd const>(losses.data(), steps));
  npy::write(dir / Spec::name / tag / "norms.npy", Eigen::Map<Eigen::VectorXd const>(norms.data(), steps));
}

/// Sequence `row` (0 or 1) of step `step`'s batch: its 8 ids or targets.
std::vector<std::int64_t> row_of(int step, bool targets, int row) {
  auto const all = ids_of(step, targets);
  return {all.begin() + row * 8, all.begin() + row * 8 + 8};
}

/// FSDP at dp 2 (full shard, a unit per block): rank r trains on sequence r of each batch ("fsdp2").
template <class Spec, class World>
void run_fsdp(World const& world, fs::path const& dir) {
  auto const dp = sw::make_mesh<"dp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  typename Spec::template model<sw::serial_plan> model(Spec::config());
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
  sw::AdamW<real> optimizer(adamw());
  std::vector<double> losses, norms;
  for (int step = 0; step < steps; ++step) {
    auto const result =
        Spec::loss(tp, sharded.forward(row_of(step, false, world.rank())), row_of(step, true, world.rank()));
    sharded.backward(result.dlogits);
    norms.push_back(optimizer.step(sharded));
    sw::zero_grad(sharded);
    losses.push_back(sw::all_reduce(dp, result.loss, sw::Avg{}));
  }
  write_steps<Spec>(world.rank() == 0, dir, "fsdp2", losses, norms);
}

/// FSDP at dp 2 beside tp (the spec's first tp size, with sequence parallelism): dp rank r trains on sequence r
/// ("fsdp2tp").
template <class Spec, class World>
void run_fsdp_tp(World const& world, fs::path const& dir) {
  int const tp_size = world.size() / 2;
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, tp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  auto const all = sw::make_mesh<"all">(world, {world.size()});
  typename Spec::template model<typename Spec::sp_plan> model(Spec::config());
  sw::parallelize(model, tp);
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
  sw::AdamW<real> optimizer(adamw());
  std::vector<double> losses, norms;
  for (int step = 0; step < steps; ++step) {
    auto const result = Spec::loss(tp, sharded.forward(row_of(step, false, dp.rank())), row_of(step, true, dp.rank()));
    sharded.backward(result.dlogits);
    norms.push_back(optimizer.step(sharded));
    sw::zero_grad(sharded);
    losses.push_back(sw::all_reduce(all, result.loss, sw::Avg{}));  // tp ranks hold the same loss
  }
  write_steps<Spec>(world.rank() == 0, dir, "fsdp2tp", losses, norms);
}

/// Two pipeline stages (1F1B), each sequence of a batch a microbatch ("pp2").
template <class Spec, class World>
void run_pipeline(World const& world, fs::path const& dir) {
  auto const pp = sw::make_mesh<"pp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  auto const c = Spec::config();
  models::LlamaStage<real> stage(c, sw::stage_split(c.layers, world.size()), pp.rank());
  sw::parallelize(stage, tp);
  sw::AdamW<real> optimizer(adamw());
  std::vector<double> losses, norms;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<std::int64_t>> const ids{row_of(step, false, 0), row_of(step, false, 1)};
    std::vector<std::vector<std::int64_t>> const targets{row_of(step, true, 0), row_of(step, true, 1)};
    real loss = 0;
    sw::run_pipeline_step(
        sw::OneFOneB{}, pp, std::span(&stage, 1), 2,
        [&](int m) { return std::span<const std::int64_t>(ids[std::size_t(m)]); },
        [&](int m, auto const& h) {
          auto result = stage.head_loss(tp, h, targets[std::size_t(m)], real(0.5));
          loss += result.loss / 2;
          return result.gradient;
        });
    norms.push_back(optimizer.step(sw::finish_gradients(stage), dp, pp));
    sw::zero_grad(stage);
    losses.push_back(sw::all_reduce(pp, stage.is_last() ? loss : real(0), sw::Sum{}));
  }
  write_steps<Spec>(world.rank() == 0, dir, "pp2", losses, norms);
}

/// Each sequence cut over cp 2 (balanced), attended by ring ("cp2").
template <class Spec, class World>
void run_context(World const& world, fs::path const& dir) {
  auto const cp = sw::submesh<"cp">(sw::make_mesh<"cp">(world, {world.size()}));
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(world, {world.size(), 1}));
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const c = Spec::config();
  typename Spec::template model<sw::serial_plan> model(c);
  sw::parallelize(model, tp);
  auto const context = sw::context_parallelize(model, cp, {c.sequence, world.size(), true}, sw::context_method::ring);
  sw::AdamW<real> optimizer(adamw());
  real const weight = static_cast<real>(context->mean_weight());
  std::vector<double> losses, norms;
  for (int step = 0; step < steps; ++step) {
    auto result =
        Spec::loss(tp, model.forward(context->my_tokens(ids_of(step, false))), context->my_tokens(ids_of(step, true)));
    result.dlogits.local *= weight;
    model.backward(result.dlogits);
    norms.push_back(optimizer.step(sw::finish_gradients(model), data));
    sw::zero_grad(model);
    losses.push_back(sw::all_reduce(data, result.loss * weight, sw::Avg{}));
  }
  write_steps<Spec>(world.rank() == 0, dir, "cp2", losses, norms);
}

/// Unsharded, TP 1 (with sequence parallelism), and each of the spec's tp sizes without ("tp2") and with ("tp2sp");
/// for the specs that ask (Spec::layouts), FSDP dp 2 (alone and beside tp), pp 2 and cp 2 too.
template <class Spec>
void on_threads(fs::path const& dir) {
  if constexpr (Spec::layouts) {
    sw::run_threads(2, [&](auto& world) { run_fsdp<Spec>(world, dir); });
    sw::run_threads(2 * Spec::tp_sizes().front(), [&](auto& world) { run_fsdp_tp<Spec>(world, dir); });
    sw::run_threads(2, [&](auto& world) { run_pipeline<Spec>(world, dir); });
    sw::run_threads(2, [&](auto& world) { run_context<Spec>(world, dir); });
  }
  sw::run_threads(1, [&](auto& world) { run<Spec, sw::serial_plan>(world, dir, "unsharded", true); });
  sw::run_threads(1, [&](auto& world) { run<Spec, typename Spec::sp_plan>(world, dir, "tp1", false); });
  for (int n : Spec::tp_sizes()) {
    std::string const tag = "tp" + std::to_string(n);
    sw::run_threads(n, [&](auto& world) { run<Spec, typename Spec::tp_plan>(world, dir, tag, false); });
    sw::run_threads(n, [&](auto& world) { run<Spec, typename Spec::sp_plan>(world, dir, tag + "sp", false); });
  }
}

/// The peft name of an adapter factor of ours ("layers.0.attention.wq.lora_A.weight" ->
/// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), as adapter_model.safetensors names it.
std::string peft_name(std::string const& ours) {
  auto const at = ours.find(".lora_");
  std::string const weight = sw::transformers_llama_name(ours.substr(0, at) + ".weight");
  return "base_model.model." + weight.substr(0, weight.size() - std::string(".weight").size()) + ours.substr(at);
}

/// The logits of batch 0 (gathered whole) into `file` (by tp rank 0).
template <class Model, class Tp>
void write_logits(Model& model, Tp const& tp, fs::path const& file) {
  auto const logits = model.forward(ids_of(0, false));
  sw::nn::matrix<real> whole = logits.local;
  if constexpr (!std::is_same_v<typename std::remove_cvref_t<decltype(logits)>::placement, sw::Replicate>)
    sw::all_gather(tp, logits.local, whole, -1);
  if (tp.rank() == 0) npy::write(file, whole);
}

/// The trained adapters in peft's files (out/peft, for PeftModel.from_pretrained) with the logits of batch 0
/// (out/peft_logits.npy); then merged and exported as a transformers folder (out/merged: model.safetensors of
/// save_sharded + consolidate under transformers' names, and config.json), for from_pretrained.
template <class Model, class Tp>
void save_peft_and_merged(Model& model, Tp const& tp, fs::path const& out) {
  sw::LoraConfig const config{.rank = 8, .alpha = 16, .target_modules = {"layers.*.attention.w[qkvo]"}};
  sw::save_lora(model, tp, out / "peft", config, sw::transformers_llama_name);
  write_logits(model, tp, out / "peft_logits.npy");
  sw::merge_lora(model);
  sw::save_sharded(model, tp, out / "merged_sharded", steps);
  if (tp.rank() != 0) return;
  sw::consolidate(out / "merged_sharded", out / "merged" / "model.safetensors",
                  {.mapping = sw::transformers_llama_mapping(), .progress = {}});
  models::write_llama_config(LlamaSpec::config(), out / "merged" / "config.json");
}

/// peft's LoraConfig(r=8, lora_alpha=16, q/k/v/o) on a parallelized model (or stage), with B set to small values
/// of its own by name (peft starts it at zero, which would leave A's first gradient zero), cut as the layout cuts it.
template <class Model>
void add_peft_lora(Model& model) {
  sw::add_lora(model, {.rank = 8, .alpha = 16, .target_modules = {"layers.*.attention.w[qkvo]"}});
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    if (!name.ends_with("lora_B.weight")) return;
    auto whole = sw::full_tensor(p);  // B's values as the unsharded model's, then this rank's rows of them
    for (Eigen::Index i = 0; i < whole.rows(); ++i)
      for (Eigen::Index j = 0; j < whole.cols(); ++j)
        whole(i, j) = 0.01 * std::sin(double(i * 7 + j) + double(name.size()));
    using Param = std::remove_cvref_t<decltype(p)>;
    bool const cut = sw::is_shard_v<typename Param::grad_placement>;  // B's rows cut as the weight's (Colwise)
    Eigen::Index const offset = cut && p.group ? p.group->rank() * p.value->rows() : 0;
    auto const block = Eigen::Index(p.copy_block), copies = Eigen::Index(p.copies);
    for (Eigen::Index i = 0; i < p.value->rows(); ++i) {
      Eigen::Index const global = i + offset;  // in the layout with repeated key-value heads
      p.value->row(i) = whole.row(copies > 1 ? (global / (block * copies)) * block + global % block : global);
    }
  });
}

/// Every adapter of the model (or stage), whole, under peft's names.
template <class Model>
Tensors adapters_of(Model& model) {
  Tensors out;
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") != std::string::npos) out[peft_name(name)] = tensor_of(sw::full_tensor(p));
  });
  return out;
}

/// Row `row` (0 or 1) of step `step`'s targets with its prompt masked, as run_lora masks the batch (3 and 6 tokens).
std::vector<std::int64_t> masked_row(int step, int row) {
  auto targets = row_of(step, true, row);
  std::fill_n(targets.begin(), row == 0 ? 3 : 6, -100);
  return targets;
}

/// LoRA as run_lora, under a layout that cuts the batch: "lora_dp2tp2" (dp 2 x tp 2 with SP and ZeRO-1, 4 ranks),
/// "lora_fsdp2" (FSDP full shard at dp 2) or "lora_pp2" (two stages, 1F1B, a row a microbatch); dp rank r (or
/// microbatch r) takes row r, whose masks leave 5 and 2 valid targets: the loss is over the step's valid tokens
/// (sw::count_valid_tokens), as peft's full-batch mean is.
template <class World>
void run_lora_layout(World const& world, fs::path const& dir, std::string const& tag) {
  bool const pipeline = tag == "lora_pp2", fsdp = tag == "lora_fsdp2";
  int const tp_size = tag == "lora_dp2tp2" ? 2 : 1;
  int const pp_size = pipeline ? world.size() : 1;
  auto const mesh = sw::make_mesh<"pp", "dp", "tp">(world, {pp_size, world.size() / pp_size / tp_size, tp_size});
  auto const pp = sw::submesh<"pp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  auto const c = LlamaSpec::config();
  using Model = models::Llama<real, LlamaSpec::sp_plan>;
  Model model(c);
  models::LlamaStage<real> stage(c, sw::stage_split(c.layers, pp_size), pp.rank());
  sw::parallelize(model, tp), sw::parallelize(stage, tp);
  if (pipeline)
    add_peft_lora(stage);
  else
    add_peft_lora(model);
  using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
  std::optional<sw::fully_sharded<Model, policy, std::remove_cvref_t<decltype(dp)>>> sharded;  // in place: hooked
  if (fsdp) sharded.emplace(model, dp, std::nullopt, sw::fsdp_options{});
  auto options = adamw();
  options.groups.clear(), options.zero1 = tp_size == 2;
  sw::AdamW<real> optimizer(options);
  std::vector<double> losses, norms;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<std::int64_t>> const ids{row_of(step, false, 0), row_of(step, false, 1)};
    std::vector<std::vector<std::int64_t>> targets{masked_row(step, 0), masked_row(step, 1)};
    if (!pipeline) targets = {targets[std::size_t(dp.rank())]};
    auto const tokens = sw::count_valid_tokens(dp, targets);
    real loss = 0;
    if (pipeline) {
      sw::run_pipeline_step(
          sw::OneFOneB{}, pp, std::span(&stage, 1), 2,
          [&](int m) { return std::span<const std::int64_t>(ids[std::size_t(m)]); },
          [&](int m, auto const& h) {
            auto result = stage.head_loss(tp, h, targets[std::size_t(m)], tokens);
            loss += result.loss;
            return result.gradient;
          });
      norms.push_back(optimizer.step(sw::finish_gradients(stage), dp, pp));
      sw::zero_grad(stage);
      loss = sw::all_reduce(pp, stage.is_last() ? loss : 0.0, sw::Sum{});
    } else if (fsdp) {
      auto const result =
          models::llama_loss(tp, sharded->forward(row_of(step, false, dp.rank())), targets[0], c.vocabulary, tokens);
      sharded->backward(result.dlogits);
      norms.push_back(optimizer.step(*sharded));
      sw::zero_grad(*sharded);
      loss = sw::all_reduce(dp, result.loss, sw::Sum{});
    } else {
      auto const result =
          models::llama_loss(tp, model.forward(row_of(step, false, dp.rank())), targets[0], c.vocabulary, tokens);
      model.backward(result.dlogits);
      norms.push_back(optimizer.step(sw::finish_gradients(model), dp));
      sw::zero_grad(model);
      loss = sw::all_reduce(dp, result.loss, sw::Sum{});
    }
    losses.push_back(loss);
  }
  if (sharded) sharded->unshard();
  Tensors const trained = pipeline ? adapters_of(stage) : adapters_of(model);
  if (tp.rank() == 0 && (pipeline || dp.rank() == 0)) write_all(trained, dir / "llama" / tag / "adapters");
  write_steps<LlamaSpec>(world.rank() == 0, dir, tag, losses, norms);
}

/// LoRA as peft's LoraConfig(r=8, lora_alpha=16, target_modules=[q, k, v, o], lora_dropout=0) with torch's AdamW
/// over the adapters: the Llama 3.2-like model unsharded and at tp 1, 2 ± SP and 4 ± SP, 5 steps on targets whose
/// prompts are masked (3 and 6 tokens of the two rows). B is set to small values of its own (peft starts it at zero,
/// which would leave A's first gradient zero); both sides start from the adapters written to dir/llama/lora_weights/.
/// Writes the losses, clipped norms and the adapters after the steps into dir/llama/<tag>/.
template <class Plan, class World>
void run_lora(World const& world, fs::path const& dir, std::string const& tag, bool write_initial, bool save) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::Llama<real, Plan> model(LlamaSpec::config());
  sw::parallelize(model, tp);
  add_peft_lora(model);
  auto const adapters = [&] { return adapters_of(model); };
  bool const writer = world.rank() == 0;
  if (write_initial) {
    auto const initial = adapters();
    if (writer) write_all(initial, dir / "llama" / "lora_weights");
  }
  sw::AdamW<real> optimizer(
      {.learning_rate = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_grad_norm = 0.05});
  std::vector<double> losses, norms;
  for (int step = 0; step < steps; ++step) {
    auto targets = ids_of(step, true);
    for (int i = 0; i < 3; ++i) targets[std::size_t(i)] = -100;   // row 0's prompt
    for (int i = 8; i < 14; ++i) targets[std::size_t(i)] = -100;  // row 1's
    auto const result = LlamaSpec::loss(tp, model.forward(ids_of(step, false)), targets);
    model.backward(result.dlogits);
    norms.push_back(optimizer.step(sw::finish_gradients(model), dp));
    sw::zero_grad(model);
    losses.push_back(result.loss);
  }
  auto const trained = adapters();
  if (save) save_peft_and_merged(model, tp, dir / "llama" / tag);
  if (!writer) return;
  write_all(trained, dir / "llama" / tag / "adapters");
  write_steps<LlamaSpec>(true, dir, tag, losses, norms);
}

/// An adapter peft saved (dir/peft_saved: transformers_reference.py's "prepare") loaded at tp 4 with SP onto the
/// initial weights: the logits of batch 0 into dir/llama/peft_saved_tp4.npy.
template <class World>
void run_peft_load(World const& world, fs::path const& dir) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  models::Llama<real, LlamaSpec::sp_plan> model(LlamaSpec::config());
  sw::parallelize(model, tp);
  sw::LoraConfig const read = sw::load_lora(model, tp, dir / "peft_saved", sw::transformers_llama_name);
  if (read.rank != 8 || read.alpha != 16) throw sw::error("transformers_dump: peft_saved is not r 8, lora_alpha 16");
  write_logits(model, tp, dir / "llama" / "peft_saved_tp4.npy");
}

/// Each schedule's learning rate over 100 steps (AdamW::learning_rate after each step), into
/// dir/schedules/<name>.npy, under the names and arguments transformers_reference.py gives get_scheduler.
void run_schedules(fs::path const& dir) {
  using kind = sw::schedule_kind;
  std::vector<std::pair<std::string, sw::LearningRateSchedule>> const schedules{
      {"constant", {}},
      {"constant_with_warmup", {.warmup_steps = 10}},
      {"linear", {.kind = kind::linear, .warmup_steps = 10, .total_steps = 100}},
      {"linear_past_the_end", {.kind = kind::linear, .total_steps = 60}},
      {"cosine", {.kind = kind::cosine, .warmup_steps = 10, .total_steps = 100}},
      {"cosine_cycles", {.kind = kind::cosine, .warmup_steps = 5, .total_steps = 60, .num_cycles = 1.5}},
      {"cosine_with_min_lr", {.kind = kind::cosine, .warmup_steps = 10, .total_steps = 100, .min_lr_rate = 0.1}}};
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  fs::create_directories(dir / "schedules");
  for (auto const& [name, schedule] : schedules) {
    models::Llama<real, sw::serial_plan> model(LlamaSpec::config());
    auto options = adamw();
    options.schedule = schedule;
    sw::AdamW<real> optimizer(options);
    Eigen::VectorXd rates(100);
    for (Eigen::Index step = 0; step < rates.size(); ++step) {
      optimizer.step(model, dp);
      rates(step) = optimizer.learning_rate();
    }
    npy::write(dir / "schedules" / (name + ".npy"), rates);
  }
}

/// On MPI, TP 2 without sequence parallelism and TP 4 with it, for the specs whose heads the size serves; the
/// initial weights are gathered from the sharded model (sw::full_tensor).
template <class Spec>
void on_mpi(fs::path const& dir) {
#ifdef SHARDWISE_DUMP_WITHOUT_MPI
  (void)dir;
  throw sw::error("transformers_dump: built without MPI (Boost.MPI/OpenMPI not found)");
#else
  auto const world = sw::mpi_world();
  auto const sizes = Spec::tp_sizes();
  if (std::find(sizes.begin(), sizes.end(), world.size()) == sizes.end()) return;
  std::string const tag = "mpi" + std::to_string(world.size());
  if (world.size() == 2)
    run<Spec, typename Spec::tp_plan>(world, dir, tag, true);
  else
    run<Spec, typename Spec::sp_plan>(world, dir, tag, true);
#endif
}

/// LoRA against peft on MPI: TP 2 (2 ranks: and FSDP dp 2, pp 2) or TP 4 with SP (4 ranks: and dp 2 x tp 2).
void lora_on_mpi(fs::path const& dir) {
#ifdef SHARDWISE_DUMP_WITHOUT_MPI
  (void)dir;
#else
  auto const world = sw::mpi_world();
  std::string const tag = "lora_mpi" + std::to_string(world.size());
  if (world.size() == 2) {
    run_lora<LlamaSpec::tp_plan>(world, dir, tag, true, false);
    run_lora_layout(world, dir, "lora_fsdp2");
    run_lora_layout(world, dir, "lora_pp2");
  } else if (world.size() == 4) {
    run_lora<LlamaSpec::sp_plan>(world, dir, tag, true, false);
    run_lora_layout(world, dir, "lora_dp2tp2");
  }
#endif
}

template <class... Specs>
void every(fs::path const& dir, bool mpi) {
  ((mpi ? on_mpi<Specs>(dir) : on_threads<Specs>(dir)), ...);
}

}  // namespace

int main(int argc, char** argv) {
  bool const mpi = argc == 3 && std::strcmp(argv[1], "--mpi") == 0;
  if (argc != 2 && !mpi) {
    std::fprintf(stderr, "usage: transformers_dump OUTPUT_DIR | mpiexec -n 2|4 transformers_dump --mpi OUTPUT_DIR\n");
    return 2;
  }
  fs::path const dir = argv[argc - 1];
  every<LlamaSpec, Llama31Spec, Qwen2Spec, Qwen2WindowSpec, Qwen3Spec, MistralSpec, SmolSpec, LlamaBiasSpec, GPT2Spec>(
      dir, mpi);
  if (mpi) lora_on_mpi(dir);
  if (!mpi) {  // training under a schedule, and the schedules alone
    sw::run_threads(1, [&](auto& world) {
      run<LlamaSpec, sw::serial_plan>(world, dir, "schedule_unsharded", false, scheduled_adamw());
    });
    sw::run_threads(2, [&](auto& world) {
      run<LlamaSpec, LlamaSpec::sp_plan>(world, dir, "schedule_tp2sp", false, scheduled_adamw());
    });
    run_schedules(dir);
    sw::run_threads(1, [&](auto& world) { run_lora<sw::serial_plan>(world, dir, "lora_unsharded", true, false); });
    sw::run_threads(1, [&](auto& world) { run_lora<LlamaSpec::tp_plan>(world, dir, "lora_tp1", false, false); });
    sw::run_threads(2, [&](auto& world) { run_lora<LlamaSpec::tp_plan>(world, dir, "lora_tp2", false, true); });
    sw::run_threads(2, [&](auto& world) { run_lora<LlamaSpec::sp_plan>(world, dir, "lora_tp2sp", false, false); });
    sw::run_threads(4, [&](auto& world) { run_lora<LlamaSpec::tp_plan>(world, dir, "lora_tp4", false, false); });
    sw::run_threads(4, [&](auto& world) { run_lora<LlamaSpec::sp_plan>(world, dir, "lora_tp4sp", false, false); });
    sw::run_threads(4, [&](auto& world) { run_peft_load(world, dir); });
    sw::run_threads(4, [&](auto& world) { run_lora_layout(world, dir, "lora_dp2tp2"); });
    sw::run_threads(2, [&](auto& world) { run_lora_layout(world, dir, "lora_fsdp2"); });
    sw::run_threads(2, [&](auto& world) { run_lora_layout(world, dir, "lora_pp2"); });
  }
  std::puts("transformers_dump: written");
  return 0;
}
