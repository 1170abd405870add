#pragma once
// GPT-2 for the planner (`shardwise plan` on a GPT-2 config.json): the block's and the ends' figures from
// models::GPT2's declared costs under gpt2_plan (sequence parallel), as the Llama family's come from LlamaBlock's.
// shardwise runs GPT-2 without pipeline stages, so the search keeps pp at 1.
#include <cstddef>
#include <utility>

#include "shardwise/cost/cost.hpp"
#include "shardwise/models/gpt2.hpp"
#include "shardwise/models/gpt2_plan.hpp"
#include "shardwise/planner/llama.hpp"

namespace shardwise::planner {

/// The planner's description of a GPT-2 of configuration `c`: 16 parameter tensors per block (two LayerNorms,
/// q, k, v, the attention's and the MLP's projections, each with a bias), the LM head tied to wte.
inline model_description describe(models::GPT2Config const& c) {
  model_description d{"GPT-2", c.vocabulary, c.dim, c.layers, c.heads, c.heads, c.hidden(), 0, false, 16, false, {}};
  d.context_parallel = true;  // sw::context_parallelize cuts its sequences (wpe at each token's global position)
  d.figures = [c](std::size_t sequence, std::size_t tokens, std::size_t tp, context_inputs const& cp) {
    using Model = models::GPT2<float, models::gpt2_plan<true>>;
    using Block = models::GPT2Block<float, subplan<models::gpt2_plan<true>, "h.*">>;
    using Token = decltype(std::declval<Model&>().wte);
    using Position = decltype(std::declval<Model&>().wpe);
    using Head = decltype(std::declval<Model&>().lm_head);
    models::GPT2Config at = c;
    at.sequence = sequence;  // the attention's panels follow the sequence; wpe keeps the config's positions
    cost_inputs const s{tokens, tp, 0, "tp", cp};
    models::GPT2Config ends_only = c;
    ends_only.layers = 0;
    cost embedding = Token::shardwise_cost(c.vocabulary, c.dim, s);
    embedding.hold(Position::shardwise_cost(c.sequence, c.dim, s));
    return model_figures{call_cost<Block, float>(Block::shardwise_cost(at, s), c.dim, c.dim, s), embedding,
                         Model::shardwise_cost(ends_only, s), Head::shardwise_cost(c.dim, c.vocabulary, s), c.layers};
  };
  return d;
}

}  // namespace shardwise::planner
