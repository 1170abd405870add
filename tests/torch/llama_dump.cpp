// The C++ half of the outside check against Hugging Face transformers' LlamaForCausalLM: shardwise's Llama
// (unsharded, and at TP 2 with sequence parallelism), its initial weights under the Hugging Face names, the
// logits of one batch, and the losses of 5 AdamW steps; then 50 steps under sw::bf16_autocast. llama_reference.py
// builds LlamaForCausalLM from the same config, loads the weights and compares (the bf16 steps against
// torch.autocast's); it shares no code with this file.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <type_traits>

#include "npy.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

models::LlamaConfig config() {
  models::LlamaConfig c;
  c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
  c.norm_eps = 1e-5, c.rope_theta = 10000.0;
  return c;
}

std::vector<std::int64_t> ids_of(int step, bool targets) {  // 2 sequences of 8 tokens
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 16; ++i) ids.push_back((step * 31 + i * 7 + (targets ? 3 : 0)) % 64);
  return ids;
}

template <class Model>
void write_weights(Model& m, fs::path const& out) {
  auto w = [&](std::string const& name, auto const& tensor) { npy::write(out / (name + ".npy"), tensor); };
  w("model.embed_tokens.weight", m.tok_embeddings.weight);
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    auto& l = m.layers[i];
    std::string const p = "model.layers." + std::to_string(i) + ".";
    w(p + "input_layernorm.weight", l.attention_norm.weight);
    w(p + "self_attn.q_proj.weight", l.attention.wq.weight);
    w(p + "self_attn.k_proj.weight", l.attention.wk.weight);
    w(p + "self_attn.v_proj.weight", l.attention.wv.weight);
    w(p + "self_attn.o_proj.weight", l.attention.wo.weight);
    w(p + "post_attention_layernorm.weight", l.ffn_norm.weight);
    w(p + "mlp.gate_proj.weight", l.feed_forward.w1.weight);
    w(p + "mlp.up_proj.weight", l.feed_forward.w3.weight);
    w(p + "mlp.down_proj.weight", l.feed_forward.w2.weight);
  }
  w("model.norm.weight", m.norm.weight);
  w("lm_head.weight", m.output.weight);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: llama_dump OUTPUT_DIR\n");
    return 2;
  }
  fs::path const out = argv[1];
  fs::create_directories(out);
  auto const c = config();
  sw::AdamWOptions<float> const adamw{
      .learning_rate = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  auto train = [&](auto& model, auto const& tp, std::string const& tag, int steps = 5, bool bf16 = false) {
    auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
    std::optional<sw::bf16_autocast<std::remove_cvref_t<decltype(model)>>> autocast;
    if (bf16) autocast.emplace(model);
    sw::AdamW<float> optimizer(adamw);
    Eigen::Matrix<double, Eigen::Dynamic, 1> losses(steps);
    for (int step = 0; step < steps; ++step) {
      auto const ids = ids_of(step, false), targets = ids_of(step, true);
      auto const logits = model.forward(ids);
      auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
      model.backward(result.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      losses(step) = result.loss;
    }
    if (tp.rank() == 0) npy::write(out / ("losses." + tag + ".npy"), losses);
  };
  {
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    models::Llama<float> model(c);
    sw::parallelize(model, tp);
    write_weights(model, out);
    npy::write(out / "logits.unsharded.npy", model.forward(ids_of(0, false)).local);
  }
  {
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    models::Llama<float> model(c);
    sw::parallelize(model, tp);
    train(model, tp, "unsharded");
  }
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {2});
    models::Llama<float, models::llama_plan<true>> model(c);
    sw::parallelize(model, tp);
    sw::nn::matrix<float> logits;
    sw::all_gather(tp, model.forward(ids_of(0, false)).local, logits, -1);  // vocabulary-sharded logits, whole
    if (tp.rank() == 0) npy::write(out / "logits.tp2_sp.npy", logits);
  });
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {2});
    models::Llama<float, models::llama_plan<true>> model(c);
    sw::parallelize(model, tp);
    train(model, tp, "tp2_sp");
  });
  {
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    models::Llama<float> model(c);
    sw::parallelize(model, tp);
    train(model, tp, "bf16.unsharded", 50, true);
  }
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {2});
    models::Llama<float, models::llama_plan<true>> model(c);
    sw::parallelize(model, tp);
    train(model, tp, "bf16.tp2_sp", 50, true);
  });
  std::puts("llama_dump: written");
  return 0;
}
