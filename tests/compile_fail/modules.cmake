# Compile-fail tests for tied weights, module calls and module structure (included from tests/CMakeLists.txt):
# each needs the failure and the library's own words (and the offending names where the check spells them).
shardwise_add_compile_fail_test(nn_tie_cut_differently SOURCE compile_fail/nn_tie_cut_differently.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::tie_weights: the two layers' plans cut the shared weight differently; give the Linear"
         "tied_weight_cut_differently<shardwise::fixed_string<7>{\"output\"}, shardwise::Shard<1>, shardwise::fixed_string<15>{\"tok_embeddings\"}, shardwise::Shard<0> ?>")
shardwise_add_compile_fail_test(nn_tie_not_a_linear SOURCE compile_fail/nn_tie_not_a_linear.cpp LINK shardwise::eigen
  EXPECT "shardwise::tie_weights: the first layer must be a shardwise::Linear \\(the one that reuses the weight\\)")
shardwise_add_compile_fail_test(plan_member_named_otherwise SOURCE compile_fail/plan_member_named_otherwise.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::parallelize: a member's plan path does not end with its name in SHARDWISE_CHILDREN"
         "member_declared_with_another_path<shardwise::fixed_string<3>{\"w3\"}, shardwise::fixed_string<3>{\"w1\"}>")
shardwise_add_compile_fail_test(module_entry_not_prepare SOURCE compile_fail/module_entry_not_prepare.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::forward: the plan entry at a module's path must be PrepareModuleInput, PrepareModuleOutput"
         "style_cannot_shard_layer_at<shardwise::fixed_string<13>{\"feed_forward\"}, shardwise::ColwiseParallel<")
shardwise_add_compile_fail_test(module_input_layout SOURCE compile_fail/module_input_layout.cpp LINK shardwise::eigen
  EXPECT "shardwise::forward: the module's input does not have its plan entry's input_layouts"
         "input_layout_mismatch_at<shardwise::fixed_string<13>{\"feed_forward\"}, shardwise::Shard<0>, shardwise::Replicate>")
shardwise_add_compile_fail_test(module_output_layout SOURCE compile_fail/module_output_layout.cpp LINK shardwise::eigen
  EXPECT "shardwise::forward: the module's output does not have its plan entry's output_layouts"
         "input_layout_mismatch_at<shardwise::fixed_string<13>{\"feed_forward\"}, shardwise::Shard<0>, shardwise::Shard<1>")
shardwise_add_compile_fail_test(module_desired_partial SOURCE compile_fail/module_desired_partial.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::redistribute: activations move from Replicate, Shard<0>, Shard<-1> or Partial<Sum> to "
         "Replicate, Shard<0> or Shard<-1>"
         "boundary_cannot_move_at<shardwise::fixed_string<13>{\"feed_forward\"}, shardwise::Shard<0>, shardwise::Partial<(shardwise::Sum)?>")
shardwise_add_compile_fail_test(module_entry_skipped SOURCE compile_fail/module_entry_skipped.cpp LINK shardwise::eigen
  EXPECT "shardwise::Linear: the input's layout is not the one this layer's style expects, and the plan has an entry"
         "input_layout_mismatch_at<shardwise::fixed_string<16>{\"feed_forward.w1\"}, shardwise::Replicate, shardwise::Shard<0>")
shardwise_add_compile_fail_test(full_gradient_partial SOURCE compile_fail/full_gradient_partial.cpp LINK shardwise::eigen
  EXPECT "shardwise::full_gradient: the gradient is still Partial")
shardwise_add_compile_fail_test(parameter_costs_shape_count SOURCE compile_fail/parameter_costs_shape_count.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::parameter_costs: a module's shardwise_shapes gives a different number of shapes than its "
         "SHARDWISE_CHILDREN lists children")
shardwise_add_compile_fail_test(parameter_costs_layer_shape SOURCE compile_fail/parameter_costs_layer_shape.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::parameter_costs: a layer has no shardwise_parameter_costs for the shape its module's "
         "shardwise_shapes gives it")
shardwise_add_compile_fail_test(parameter_costs_container_shape SOURCE compile_fail/parameter_costs_container_shape.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::parameter_costs: a child is neither a layer nor a module \\(SHARDWISE_CHILDREN\\); a vector or "
         "optional child takes a sw::repeated_shape")
shardwise_add_compile_fail_test(hooks_member_misspelt SOURCE compile_fail/hooks_member_misspelt.cpp LINK shardwise::eigen
  EXPECT "shardwise::hooks: a module lists a hook in SHARDWISE_HOOKS\\(...\\) but defines no member shardwise_<hook>"
         "hook_listed_but_not_defined<Heads, shardwise::hooks::on_parallelize>")
shardwise_add_compile_fail_test(hooks_not_listed SOURCE compile_fail/hooks_not_listed.cpp LINK shardwise::eigen
  EXPECT "shardwise::hooks: a module defines a hook \\(a member shardwise_<hook>, named below\\) that its SHARDWISE_HOOKS"
         "hook_defined_but_not_listed<Heads, shardwise::hooks::on_parallelize>")
shardwise_add_compile_fail_test(hooks_list_misspelt SOURCE compile_fail/hooks_list_misspelt.cpp LINK shardwise::eigen
  EXPECT "on_paralelize" "shardwise::hooks: a module defines a hook \\(a member shardwise_<hook>, named below\\)")
shardwise_add_compile_fail_test(lazy_forward_free SOURCE compile_fail/lazy_forward_free.cpp LINK shardwise::eigen
  EXPECT "shardwise::forward: the model is declared with sw::Lazy and its parameters are not materialized; call "
         "sw::forward on the model that sw::materialize\\(lazy\\)")
shardwise_add_compile_fail_test(parallelize_not_a_module SOURCE compile_fail/parallelize_not_a_module.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::parallelize: the model's type lists no children; declare its layers and sub-modules with "
         "SHARDWISE_CHILDREN")
shardwise_add_compile_fail_test(lazy_without_init SOURCE compile_fail/lazy_without_init.cpp LINK shardwise::eigen
  EXPECT "shardwise::Lazy: no constructor argument carries an sw::init")
shardwise_add_compile_fail_test(moe_router_in_plan SOURCE compile_fail/moe_router_in_plan.cpp LINK shardwise::eigen
  EXPECT "shardwise::models::MoeFeedForward: its router \\(\"gate\"\\) computes whole on every rank; leave it out of "
         "the plan")
shardwise_add_compile_fail_test(moe_experts_in_plan SOURCE compile_fail/moe_experts_in_plan.cpp LINK shardwise::eigen
  EXPECT "shardwise::models::MoeFeedForward: its experts take and give replicated rows \\(the dispatch and the "
         "combine need them\\); leave \"experts.[*]\" and \"shared_expert\" out of the plan, or cut each one's w1 and w3 "
         "ColwiseParallel<> and its w2 RowwiseParallel<Shard<-1>, Replicate>, with PrepareModuleInput<Replicate, Replicate> "
         "at the expert itself")
shardwise_add_compile_fail_test(experts_ep_mesh_2d SOURCE compile_fail/experts_ep_mesh_2d.cpp LINK shardwise::eigen
  EXPECT "shardwise::expert_parallelize: experts are placed over one mesh axis|||pass mesh.axis<.ep.>[(][)] "
         "[(]or sw::submesh<.ep.>[(]mesh[)][)]")
shardwise_add_compile_fail_test(experts_ep_static_size SOURCE compile_fail/experts_ep_static_size.cpp
  LINK shardwise::eigen
  EXPECT "shardwise::expert_parallelize: the ep mesh's static size does not divide a module's static expert count"
         "static_experts_do_not_divide_over_ep_ranks<6, 4, shardwise::fixed_string<22>.\"layers.[*].feed_forward\"")
