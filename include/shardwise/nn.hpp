#pragma once
// Layers, parallel styles, plans and the loss: everything tensor parallelism needs (Eigen required).
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/elementwise.hpp"
#include "shardwise/nn/embedding.hpp"
#include "shardwise/nn/functional.hpp"
#include "shardwise/nn/linear.hpp"
#include "shardwise/nn/loss.hpp"
#include "shardwise/nn/norm.hpp"
#include "shardwise/nn/parameter.hpp"
#include "shardwise/nn/prepare.hpp"
#include "shardwise/nn/styles.hpp"
#include "shardwise/plan/module.hpp"
#include "shardwise/plan/plan.hpp"
