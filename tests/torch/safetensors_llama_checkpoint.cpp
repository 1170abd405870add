// The shardwise half of the consolidation check against Hugging Face transformers (safetensors_llama_reference.py):
// shardwise's Llama saved sharded at TP 4 (a vocabulary of 62 padded to 64, 2 key-value heads repeated for 4
// ranks) into DIR/ckpt, and the unsharded model's logits for one batch in DIR/logits.npy. The Python side runs
// `shardwise consolidate --names transformers-llama`, loads model.safetensors into LlamaForCausalLM and compares.
// The same for shardwise's GPT-2 (vocabulary 61 padded to 62, saved at TP 2 into DIR/gpt2_ckpt, logits in
// DIR/gpt2_logits.npy), consolidated with --names transformers-gpt2 and loaded by GPT2LMHeadModel.from_pretrained;
// and for a Qwen2 (biases, a window on its second layer) and a Mistral (a window) saved at TP 2 (DIR/qwen2_ckpt,
// DIR/mistral_ckpt, DIR/qwen2_logits.npy, DIR/mistral_logits.npy), consolidated with --names transformers-qwen2
// and -mistral and loaded by AutoModelForCausalLM.from_pretrained; and a Qwen3 (q and k norms with weights other
// than one, heads of 16 on a width of 32, biases on the four attention projections) the same way (DIR/qwen3_ckpt,
// DIR/qwen3_logits.npy, --names transformers-qwen3).
#include <cstdio>
#include <filesystem>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <vector>

#include "npy.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: safetensors_llama_checkpoint OUTPUT_DIR\n");
    return 2;
  }
  fs::path const out = argv[1];
  fs::create_directories(out);
  models::LlamaConfig c;
  c.vocabulary = 62, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
  std::vector<std::int64_t> ids;  // the batch safetensors_llama_reference.py uses: 2 sequences of 8
  for (int i = 0; i < 16; ++i) ids.push_back((i * 7 + 3) % 62);

  models::Llama<float> reference(c);
  npy::write(out / "logits.npy", reference.forward(ids).local);

  sw::run_threads(4, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
    models::Llama<float, models::llama_plan<false>> model(c);
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, out / "ckpt", 17, {{"model", "llama-test"}});
  });
  models::GPT2Config g;
  g.vocabulary = 61, g.dim = 32, g.layers = 2, g.heads = 4, g.sequence = 8;
  models::GPT2<float> gpt2(g);
  std::vector<std::int64_t> gpt2_ids;  // (i * 7 + 3) % 61 for i < 16, as the Python side
  for (int i = 0; i < 16; ++i) gpt2_ids.push_back((i * 7 + 3) % 61);
  npy::write(out / "gpt2_logits.npy", gpt2.forward(gpt2_ids).local);
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
    models::GPT2<float, models::gpt2_plan<false>> model(g);
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, out / "gpt2_ckpt", 5);
  });
  // Qwen2 (biases on q, k and v, a window of 3 on its second layer) and Mistral (a window of 4), saved at TP 2.
  models::LlamaConfig qwen2 = c, mistral = c, qwen3 = c;
  qwen2.attention_bias = true, qwen2.sliding_window = 3, qwen2.first_window_layer = 1, qwen2.norm_eps = 1e-6;
  mistral.sliding_window = 4;
  qwen3.qk_norm = true, qwen3.explicit_head_dim = 16, qwen3.attention_bias = qwen3.attention_output_bias = true;
  qwen3.norm_eps = 1e-6;
  auto const head_norms_not_one = [](auto& model) {  // so that q_norm and k_norm swapped or left out would show
    for (auto& block : model.layers)
      if (auto& a = block.attention; a.q_norm)
        for (Eigen::Index i = 0; i < a.q_norm->weight.size(); ++i)
          a.q_norm->weight(i) = 1.0f + 0.05f * float(i), a.k_norm->weight(i) = 1.0f - 0.03f * float(i);
  };
  for (auto const& [name, config] :
       {std::pair{"qwen2", qwen2}, std::pair{"mistral", mistral}, std::pair{"qwen3", qwen3}}) {
    models::Llama<float> whole(config);
    head_norms_not_one(whole);
    npy::write(out / (std::string(name) + "_logits.npy"), whole.forward(ids).local);
    sw::run_threads(2, [&, n = std::string(name), cfg = config](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
      models::Llama<float, models::llama_plan<false>> model(cfg);
      sw::parallelize(model, tp);
      head_norms_not_one(model);
      sw::save_sharded(model, tp, out / (n + "_ckpt"), 3);
    });
  }
  std::printf("wrote %s/ckpt and %s/logits.npy\n", out.c_str(), out.c_str());
  return 0;
}
