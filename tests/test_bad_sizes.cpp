// Sizes that cannot be right are refused at the public entry points, in every build type (this binary is
// also run under ASan+UBSan): a message naming the thing and the fix, never a wrong number or a bad read.
#include <doctest/doctest.h>

#include <Eigen/Dense>
#include <cstdint>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/models/gpt2.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

namespace sw = shardwise;

namespace {

sw::models::LlamaConfig small() {
  sw::models::LlamaConfig c;
  c.vocabulary = 32, c.dim = 16, c.layers = 1, c.heads = 4, c.kv_heads = 2, c.hidden = 24, c.sequence = 4;
  return c;
}

}  // namespace

TEST_CASE("a Llama config with impossible sizes is refused, naming the field") {
  struct bad {
    char const* what;
    void (*edit)(sw::models::LlamaConfig&);
    char const* message;
  };
  std::vector<bad> const cases{
      {"zero heads", [](auto& c) { c.heads = 0; }, "LlamaConfig: heads is 0; give it a positive size"},
      {"zero kv heads", [](auto& c) { c.kv_heads = 0; }, "LlamaConfig: kv_heads is 0"},
      {"zero vocabulary", [](auto& c) { c.vocabulary = 0; }, "LlamaConfig: vocabulary is 0"},
      {"zero sequence", [](auto& c) { c.sequence = 0; }, "LlamaConfig: sequence is 0"},
      {"dim not heads * width", [](auto& c) { c.heads = 3, c.kv_heads = 3; }, "dim 16 is not a multiple of heads 3"},
      {"heads not kv multiple", [](auto& c) { c.kv_heads = 3; }, "heads 4 is not a multiple of kv_heads 3"},
      {"odd head width", [](auto& c) { c.dim = 12; }, "the head width 3 is odd"},
      {"overflowing table", [](auto& c) { c.vocabulary = std::size_t{1} << 40; }, "overflows a table"},
      {"zero epsilon", [](auto& c) { c.norm_eps = 0; }, "norm_eps 0 and rope_theta 10000 must be positive"},
  };
  for (auto const& each : cases) {
    CAPTURE(each.what);
    auto c = small();
    each.edit(c);
    CHECK_THROWS_WITH_AS(sw::models::Llama<float>{c}, doctest::Contains(each.message), sw::error);
  }
  CHECK_NOTHROW(sw::models::Llama<float>{small()});
}

TEST_CASE("a GPT-2 config with impossible sizes is refused, naming the field") {
  auto const made = [](auto edit) {
    sw::models::GPT2Config c;
    c.vocabulary = 32, c.dim = 16, c.layers = 1, c.heads = 4, c.sequence = 4;
    edit(c);
    return sw::models::GPT2<float>{c};
  };
  CHECK_THROWS_WITH_AS(made([](auto& c) { c.heads = 0; }), doctest::Contains("GPT2Config: heads is 0"), sw::error);
  CHECK_THROWS_WITH_AS(made([](auto& c) { c.heads = 3; }), doctest::Contains("dim 16 does not divide into 3 heads"),
                       sw::error);
  CHECK_THROWS_WITH_AS(made([](auto& c) { c.vocabulary = std::size_t{1} << 40; }),
                       doctest::Contains("overflows a table"), sw::error);
  CHECK_THROWS_WITH_AS(made([](auto& c) { c.layer_norm_eps = -1; }),
                       doctest::Contains("layer_norm_eps -1 must be positive"), sw::error);
  CHECK_NOTHROW(made([](auto&) {}));
}

TEST_CASE("a batch that is not whole sequences is refused by the Llama model") {
  sw::models::Llama<float> model(small());
  std::vector<std::int64_t> const ids{1, 2, 3, 4, 5, 6};  // 1.5 sequences of 4
  CHECK_THROWS_WITH_AS(
      model.forward(ids),
      "shardwise::models::Llama::forward: 6 token ids are not whole sequences of 4 "
      "(config().sequence); give it a batch of whole sequences, or each sequence's length (sequence_lengths)",
      sw::error);
}

TEST_CASE("targets outside the vocabulary are refused by the parallel loss on every rank") {
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{8}, std::int64_t{7}}) {
    CAPTURE(bad);
    std::vector<std::string> messages(2);
    sw::run_threads(2, [&](auto const& world) {
      auto const tp = sw::make_mesh<"tp">(world, {2});
      Eigen::Matrix<float, -1, -1, Eigen::RowMajor> local = Eigen::Matrix<float, -1, -1, Eigen::RowMajor>::Ones(2, 4);
      std::vector<std::int64_t> const targets{0, bad};
      try {  // 8 columns in all, of which the first 7 are classes (the last is vocabulary padding)
        sw::loss_parallel(tp, sw::Activation<float, sw::Shard<-1>>{local}, targets, -100, 7);
      } catch (sw::error const& e) {
        messages[static_cast<std::size_t>(world.rank())] = e.what();
      }
    });
    CHECK(messages[0] == "shardwise::loss_parallel: target " + std::to_string(bad) +
                             " is outside the vocabulary [0, 7) and is not ignore_index (-100); check the token ids");
    CHECK(messages[1] == messages[0]);
  }
}

TEST_CASE("a Linear given the wrong input width raises instead of reading past the input") {
  sw::Linear<float> layer(8, 4, 1);
  Eigen::Matrix<float, -1, -1, Eigen::RowMajor> x = Eigen::Matrix<float, -1, -1, Eigen::RowMajor>::Ones(3, 6);
  CHECK_THROWS_WITH_AS(layer(x), doctest::Contains("the input has 6 features on this rank but the layer takes 8"),
                       sw::error);
}
