# Fails unless the object file OBJECT calls checkpoint IO's entry points from shardwise::separate_checkpoint and
# compiles none of the code behind them: an entry point whose declaration drifted from its definition, or a template
# that reached a helper directly, would compile that code inline again and still link, silently losing the gain.
execute_process(COMMAND nm -C ${OBJECT} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${OBJECT}")
endif()
# What lies behind them: the index's JSON, the safetensors writer and header parser, the commit of a save.
foreach(name IN ITEMS "checkpoint_index_from_json\\(" "safetensors_writer::write\\(" "parse_safetensors_header\\("
                      "detail::commit_save\\(" "detail::plan_export\\(")
  string(REPLACE "\\" "" shown "${name}")
  if(symbols MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*${name}")
    message(FATAL_ERROR "WRONG: ${OBJECT} compiles ${shown}) of its own")
  endif()
endforeach()
# The entry points it calls, and no JSON of its own: the program writes its config.json through
# models::write_llama_config.
set(CALLS "detail::save_sharded_stage,shardwise::consolidate,detail::read_shard,detail::mapped_locator::operator\\(\\),\
models::read_llama_config,models::write_llama_config")
include(${CMAKE_CURRENT_LIST_DIR}/check_no_json_code.cmake)
