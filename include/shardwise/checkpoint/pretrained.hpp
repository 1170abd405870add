#pragma once
// Loading checkpoints of full tensors that another program wrote — Hugging Face's save_pretrained folders
// (model.safetensors, or shards listed by model.safetensors.index.json), `shardwise consolidate` output — into
// a parallelized (or lazily declared) model of any tp size, each rank reading only its slices.
//
//   sw::load_report r = sw::load_pretrained(model, tp, "gpt2/", gpt2_mapping, {.strict = false});
//   sw::load_consolidated(model, tp, "model.safetensors", sw::transformers_llama_name);  // names only
//
// A mapping says where each model tensor lies in the file: under which name, whether transposed, and which
// slice of a bigger (fused) tensor. The report lists, as transformers' load_state_dict(strict=False) does, the
// model tensors the checkpoint lacks and the checkpoint tensors nothing read.
#include <concepts>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/file_checks.hpp"
#include "shardwise/checkpoint/model_tensors.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/checkpoint/sharded_load.hpp"
#include "shardwise/checkpoint/tensor_mapping.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/core/read_file.hpp"
#include "shardwise/nn/experts/expert_parallel.hpp"
#include "shardwise/nn/lazy.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES  // JSON is parsed only where the entry points are compiled
#include <nlohmann/json.hpp>

#include "shardwise/core/bounded_json.hpp"
#endif

namespace shardwise {

/// What a load found, as transformers' load_state_dict(strict=False) reports it.
struct load_report {
  std::map<std::string, std::string> metadata;  ///< the files' __metadata__ and the shard index's "metadata"
  std::vector<std::string> missing;             ///< model tensors the checkpoint does not provide (kept as they were)
  std::vector<std::string> unexpected;          ///< checkpoint tensors that no model tensor read
};

/// save_pretrained's names: one file, or shards listed by the index (tensor name -> file).
inline constexpr std::string_view pretrained_file_name = "model.safetensors";
inline constexpr std::string_view pretrained_index_name = "model.safetensors.index.json";

namespace detail {

/// The safetensors files of a checkpoint of full tensors and which file holds each tensor.
struct pretrained_files {
  std::filesystem::path folder;                 // the files are named relative to it
  std::string label;                            // the file or index named in errors
  std::map<std::string, std::string> file_of;   // tensor -> file
  std::map<std::string, std::string> metadata;  // the index's "metadata", as text
};

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
/// Checks and reads the text of model.safetensors.index.json into `found` (whose label names it in errors).
inline void pretrained_index_from_json(std::string_view text, pretrained_files& found, std::string_view who) {
  using nlohmann::json;
  auto const bad = [&](auto const&... parts) {
    fail("shardwise::", who, ": \"", found.label, "\" ", parts...,
         "; it is not a save_pretrained shard index: save the model again");
  };
  json const root = parse_bounded_json(
      text, max_json_depth, [&](std::size_t depth) { bad("nests JSON ", depth, " deep"); },
      [&](std::string const& reason) { bad("is not valid JSON (", reason, ")"); });
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object())
    bad("has no \"weight_map\" object of tensor names to files");
  for (auto const& [name, file] : root["weight_map"].items()) {
    if (!file.is_string()) bad("maps tensor \"", name, "\" to ", file.dump(), ", not a file name");
    std::string const f = file.get<std::string>();
    if (f.empty() || f.front() == '/' || f.find("..") != std::string::npos)
      bad("puts tensor \"", name, "\" in \"", f, "\", outside the folder");
    found.file_of[name] = f;
  }
  if (root.contains("metadata") && root["metadata"].is_object())
    for (auto const& [key, value] : root["metadata"].items())
      found.metadata[key] = value.is_string() ? value.get<std::string>() : value.dump();  // total_size: a number
}

/// Reads model.safetensors.index.json: its "weight_map" and "metadata".
inline pretrained_files read_pretrained_index(std::filesystem::path const& folder, std::string_view who) {
  pretrained_files found{folder, (folder / pretrained_index_name).string(), {}, {}};
  pretrained_index_from_json(
      read_regular_file(found.label, concat("shardwise::", who), "give the folder save_pretrained wrote"), found, who);
  return found;
}
#endif

/// A safetensors file, or a folder holding model.safetensors.index.json (preferred: a sharded save) or
/// model.safetensors.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY pretrained_files find_pretrained_files(std::filesystem::path const& path,
                                                                         std::string_view who);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY pretrained_files find_pretrained_files(std::filesystem::path const& path,
                                                                         std::string_view who) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) {  // a file: its own tensors (opening it raises if it is not there)
    pretrained_files found{path.parent_path().empty() ? fs::path(".") : path.parent_path(), path.string(), {}, {}};
    safetensors_file const f(path.string());
    for (tensor_info const& info : f.tensors()) found.file_of[info.name] = path.filename().string();
    return found;
  }
  if (fs::exists(path / pretrained_index_name)) return read_pretrained_index(path, who);
  if (fs::exists(path / pretrained_file_name)) return find_pretrained_files(path / pretrained_file_name, who);
  fail("shardwise::", who, ": \"", path.string(), "\" holds neither ", pretrained_file_name, " nor ",
       pretrained_index_name, "; give a safetensors file or a folder that save_pretrained wrote");
}
#endif

inline std::string source_text(tensor_source const& s, std::vector<std::uint64_t> const& file_shape) {
  std::string text = "file tensor \"" + s.name + "\" of shape " + shape_text(file_shape);
  if (s.transpose && file_shape.size() == 2) text += ", transposed";
  if (s.stacked_index != -1) text += concat(", its [", s.stacked_index, "]");
  if (s.slice_dim != -1)
    text +=
        concat(", sliced to [", s.slice_start, ", ", s.slice_start + s.slice_size, ") along dimension ", s.slice_dim);
  return text;
}

/// The checkpoint piece that source `s` gives model tensor t, checked: the file's tensor, transposed and sliced,
/// must have the model's stored shape.
inline checkpoint_piece mapped_piece(tensor_layout const& t, tensor_source const& s, tensor_info const& info,
                                     std::string const& file, std::string const& label, std::string_view who) {
  std::vector<std::uint64_t> shape = info.shape;
  if (s.stacked_index != -1) {  // one of the model tensors stacked along the file tensor's first dimension
    if (s.stacked_index < 0 || shape.size() < 2 || static_cast<std::uint64_t>(s.stacked_index) >= shape[0] ||
        s.transpose)
      fail("shardwise::", who, ": \"", label, "\": the model's tensor \"", t.name, "\" maps to ",
           source_text(s, info.shape), " at stacked index ", s.stacked_index,
           ", which it does not stack (a stacked tensor has a first dimension beyond the index, and is not "
           "transposed): fix the mapping");
    shape.erase(shape.begin());
  }
  bool const transposed = s.transpose && shape.size() == 2;
  if (s.transpose && shape.size() > 2)
    fail("shardwise::", who, ": \"", label, "\": the model's tensor \"", t.name, "\" maps to ",
         source_text(s, info.shape), ", which has ", shape.size(),
         " dimensions; transpose takes a matrix: fix the mapping");
  if (transposed) std::swap(shape[0], shape[1]);
  std::vector<std::uint64_t> offset(shape.size(), 0);
  if (s.slice_dim != -1) {
    auto const d = static_cast<std::size_t>(s.slice_dim);
    if (s.slice_dim < 0 || d >= shape.size())
      fail("shardwise::", who, ": \"", label, "\": the model's tensor \"", t.name, "\" maps to ",
           source_text(s, info.shape), ", which has no dimension ", s.slice_dim,
           shape.size() > 1 ? "; slice along dimension 0 or 1 (or -1: whole)"
                            : "; slice along dimension 0 (or -1: whole)",
           ": fix the mapping");
    if (s.slice_start > shape[d] || s.slice_size > shape[d] - s.slice_start)
      fail("shardwise::", who, ": \"", label, "\": the model's tensor \"", t.name, "\" maps to ",
           source_text(s, info.shape), ", beyond its ", shape[d], " along dimension ", d,
           "; slice inside the tensor: fix the mapping");
    offset[d] = s.slice_start;
    shape[d] = s.slice_size;
  }
  if (shape != t.stored_shape())
    fail("shardwise::", who, ": \"", label, "\": tensor \"", t.name, "\" has shape ", shape_text(t.stored_shape()),
         " in the model but ", shape_text(shape), " in the checkpoint (", source_text(s, info.shape),
         "); fix the mapping's transpose or slice, or load a checkpoint of the same model configuration");
  checkpoint_piece p{file, std::vector<std::uint64_t>(shape.size(), 0), shape, s.name};
  p.transposed = transposed;
  p.stacked_index = s.stacked_index;
  if (s.slice_dim != -1) p.offset_in_file = std::move(offset);
  return p;
}

/// Whether file tensor `file_name` is the source the mapping gives `name`, a weight tied to `owner`'s: then the
/// pair of them. A mapping that has no source for the tied weight, or throws for it, answers nullopt.
inline std::optional<std::pair<std::string, std::string>> tied_pair(checkpoint_mapping const& mapping,
                                                                    std::string const& file_name, std::string name,
                                                                    std::string_view owner) {
  std::optional<tensor_source> s;
  try {
    s = mapping ? mapping(name) : tensor_source{name};
  } catch (std::exception const&) {  // only asked to explain an error: the error stays as it was
    return std::nullopt;
  }
  if (!s || s->name != file_name) return std::nullopt;
  return std::pair{std::move(name), std::string(owner) + ".weight"};
}

/// When file tensor `file_name` is the source the mapping gives a weight the model ties to another layer's
/// (a tied output projection: transformers' lm_head.weight), that weight's name and its owner's; else nullopt.
template <class Model>
std::optional<std::pair<std::string, std::string>> tied_source(Model& model, checkpoint_mapping const& mapping,
                                                               std::string const& file_name) {
  std::optional<std::pair<std::string, std::string>> found;
  if constexpr (requires { model.shardwise_for_each_parameter_shard([](auto&&...) {}); }) {
    for_each_named_layer(model, [&](auto& l, std::string const& path) {
      if constexpr (requires {
                      { l.tied() } -> std::convertible_to<bool>;
                      l.tied_to();
                    })
        if (!found && l.tied()) found = tied_pair(mapping, file_name, path + ".weight", l.tied_to());
    });
  } else {  // the model's list, which its optimizer builds too
    for (listed_layer const& l : list_model<model_element_t<Model>>(model, {.names = true}).layers)
      if (!found && !l.tied_to.empty()) found = tied_pair(mapping, file_name, l.path + ".weight", l.tied_to);
  }
  return found;
}

/// The module a tensor belongs to, one level above its layer ("a.b.q_norm.weight" -> "a.b"; "" when none).
inline std::string module_around(std::string_view tensor) {
  std::size_t const leaf = tensor.rfind('.');
  std::size_t const layer = leaf == std::string_view::npos ? leaf : tensor.rfind('.', leaf - 1);
  return layer == std::string_view::npos ? std::string() : std::string(tensor.substr(0, layer));
}

/// Whether a tensor of `module` (a name beginning "module.") is among `used`.
inline bool reads_inside(std::set<std::string> const& used, std::string const& module) {
  if (module.empty()) return false;
  auto const at = used.lower_bound(module + ".");
  return at != used.end() && at->starts_with(module + ".");
}

/// What a mapped load needs to know of the model beyond its tensors: which tied weight, if any, a file tensor is
/// the mapping's source of (tied_source).
using tied_lookup = std::function<std::optional<std::pair<std::string, std::string>>(std::string const&)>;

/// A mapped load's checkpoint_locator: an index of the model's tensors built from the mapping and the files'
/// headers (missing and unexpected tensors checked per options.strict), with the files' metadata in `report`.
struct mapped_locator {
  model_tensors const& model;
  int size, rank;
  tied_lookup tied;
  std::filesystem::path path;
  checkpoint_mapping const& mapping;
  load_options const& options;
  std::string_view who;
  load_report& report;

  void operator()(std::filesystem::path& source, checkpoint_index& index, std::string& label,
                  std::vector<std::string>& unexpected) const;
};

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void mapped_locator::operator()(std::filesystem::path& source,
                                                                  checkpoint_index& index, std::string& label,
                                                                  std::vector<std::string>& unexpected) const {
  namespace fs = std::filesystem;
  pretrained_files found = find_pretrained_files(path, who);
  source = found.folder;
  label = found.label;
  index = {};
  index.metadata = std::move(found.metadata);
  std::map<std::string, std::unique_ptr<safetensors_file>> files;       // headers only; closed once checked
  std::map<std::string, std::map<std::string, std::string>> checksums;  // per file: tensor -> its checksum
  std::set<std::string> used;
  model.for_each(size, rank, true, [&](tensor_layout const& t, tensor_values const&) {
    std::optional<tensor_source> const s = mapping ? mapping(t.name) : tensor_source{t.name};
    auto const where = s ? found.file_of.find(s->name) : found.file_of.end();
    if (where == found.file_of.end()) {  // missing: strict raises here, saying why; else load_into reports it
      if (options.strict)
        fail("shardwise::", who, ": \"", label, "\": the model's tensor \"", t.name, "\" is not in the checkpoint",
             !s                  ? std::string(" (the mapping gives it no source)")
             : s->name != t.name ? " (as \"" + s->name + "\")"
                                 : std::string(),
             "; load a checkpoint of this model, fix the mapping, or pass load_options{.strict = false} to keep "
             "its current value");
      return;
    }
    auto& file = files[where->second];
    if (!file && !fs::exists(source / where->second))
      fail("shardwise::", who, ": \"", label, "\" puts tensor \"", s->name, "\" in \"",
           (source / where->second).string(),
           "\", which is missing; the folder is incomplete: copy the file back or "
           "save the model again");
    if (!file) {
      file = std::make_unique<safetensors_file>((source / where->second).string());
      index.metadata.insert(file->metadata().begin(), file->metadata().end());
      for (auto const& field : metadata_strings(*file, config_metadata_key, who)) index.config.insert(field);
      checksums[where->second] = metadata_strings(*file, checksums_metadata_key, who);
    }
    if (!file->contains(s->name))
      fail("shardwise::", who, ": \"", label, "\" puts tensor \"", s->name, "\" in \"", file->path(),
           "\", which does not hold it; the folder is incomplete or mixed: save the model again");
    tensor_info const& info = file->info(s->name);
    checkpoint_piece piece = mapped_piece(t, *s, info, where->second, label, who);
    if (auto const sum = checksums[where->second].find(s->name); sum != checksums[where->second].end())
      piece.checksum = sum->second;  // the reader checks the file's tensor against it before reading from it
    index.tensors.push_back({t.name, info.type, piece.shape, "", {}});
    index.tensors.back().pieces.push_back(std::move(piece));
    used.insert(s->name);
  });
  for (auto const& [name, file] : found.file_of) {
    if (used.count(name)) continue;
    // Even when not strict: the bias of a layer whose weight the model reads is what that layer computes with.
    if (name.ends_with(".bias") && used.count(name.substr(0, name.size() - 4) + "weight"))
      fail("shardwise::", who, ": \"", label, "\": the checkpoint's tensor \"", name,
           "\" is the bias of a layer whose weight the model reads, and no tensor of the model reads it (the "
           "layer has no bias, or the mapping gives its bias another source): it would compute other numbers; build "
           "the model with that bias (a Llama: attention_bias or mlp_bias in its config, as the checkpoint's "
           "config.json says) or map it");
    // Nor a norm inside a module the model reads (Qwen3's self_attn.q_norm): that module computes with it.
    if (name.ends_with("norm.weight") && reads_inside(used, module_around(name)))
      fail("shardwise::", who, ": \"", label, "\": the checkpoint's tensor \"", name,
           "\" is a norm inside a module whose other tensors the model reads, and no tensor of the model reads it: "
           "it would compute other numbers; build the model with that norm (a Llama: qk_norm in its config, as a "
           "Qwen3 config.json says) or map it");
    if (options.strict) {
      if (auto const tied_to = tied(name))
        fail("shardwise::", who, ": \"", label, "\": the checkpoint's tensor \"", name, "\" is the model's \"",
             tied_to->first, "\", which the model ties to \"", tied_to->second,
             "\" (it computes with that tensor and does not read this one); load the checkpoint into a model "
             "that does not tie them, or pass load_options{.strict = false} to skip it");
      fail("shardwise::", who, ": \"", label, "\": the checkpoint's tensor \"", name,
           "\" is not in the model (no model tensor reads it); load it into the model it was saved from, map a "
           "model tensor to it, or pass load_options{.strict = false} to skip it");
    }
    unexpected.push_back(name);
  }
  report.metadata = index.metadata;
}
#endif

/// load_pretrained and load_consolidated: loads through load_into, the index built by a mapped_locator.
template <class Model, class TpMesh>
load_report load_mapped(Model& model, TpMesh const& tp, std::filesystem::path const& path,
                        checkpoint_mapping const& mapping, load_options const& options, std::string_view who) {
  if (placed_experts_in(model))  // its files name every expert, and nothing tells which model tensor each one is
    fail("shardwise::", who,
         ": the model's experts are placed over ep ranks (sw::expert_parallelize), and a load "
         "of full tensors into placed experts is not built yet; load \"",
         path.string(), "\" first, then place the experts (or load a checkpoint that save_sharded wrote)");
  load_report report;
  model_tensors const tensors = tensors_of(model);
  tied_lookup const tied = [&](std::string const& name) { return tied_source(model, mapping, name); };
  auto outcome = load_into(model, tp, path, options, who,
                           mapped_locator{tensors, tp.size(), tp.rank(), tied, path, mapping, options, who, report});
  report.missing = std::move(outcome.missing);
  report.unexpected = std::move(outcome.unexpected);
  return report;
}

}  // namespace detail

/// Loads a checkpoint of full tensors into a parallelized model of any tp size, each rank reading only the
/// slices its shard needs (transposed ones are read in bounded boxes and transposed into place). `path` is a
/// safetensors file or a save_pretrained folder (model.safetensors, or shards with model.safetensors.index.json).
/// `mapping` gives each model tensor's source (default: the same name, as stored). options.strict (default)
/// makes a missing or unexpected tensor an error; otherwise they are reported, and missing tensors keep their
/// values. A weight the model ties to another (sw::tie_weights: an output projection tied to the embedding) is
/// loaded once, as its owner; a file tensor the mapping gives the tied weight (lm_head.weight, which
/// save_pretrained leaves out of a tied model) is not read: unexpected, and when strict an error saying that the
/// model ties it. Returns the files' metadata and those lists.
template <class Model, class TpMesh>
load_report load_pretrained(Model& model, TpMesh const& tp, std::filesystem::path const& path,
                            checkpoint_mapping const& mapping = {}, load_options const& options = {}) {
  return detail::load_mapped(model, tp, path, mapping, options, "load_pretrained");
}

/// Fills a lazily declared, parallelized model (each rank allocates and reads only its shard; a missing tensor
/// stays zero). Returns the model, now usable; the report goes to *report when given.
template <module Model, class TpMesh>
Model& load_pretrained(Lazy<Model>& lazy, TpMesh const& tp, std::filesystem::path const& path,
                       checkpoint_mapping const& mapping = {}, load_options const& options = {},
                       load_report* report = nullptr) {
  load_report r = load_pretrained(lazy.unmaterialized(), tp, path, mapping, options);
  if (report) *report = std::move(r);
  return lazy.unmaterialized();
}

namespace detail {
/// A rename-only mapping: every tensor whole and as stored, under names(model_name).
inline checkpoint_mapping renaming(std::function<std::string(std::string const&)> const& names) {
  if (!names) return {};
  return [names](std::string const& name) -> std::optional<tensor_source> { return tensor_source{names(name)}; };
}
}  // namespace detail

/// Loads one consolidated safetensors file of full tensors (from `shardwise consolidate`, or a Hugging Face
/// model.safetensors with `names` = sw::transformers_llama_name) into a parallelized model of any tp size: each
/// rank reads only its slices. `names` maps shardwise's parameter names to the file's (renames only; for
/// transposed or fused tensors use load_pretrained). A file from `shardwise consolidate` carries the model's
/// configuration and a checksum per tensor: a model of another configuration is refused, naming the field, and
/// each tensor is checked against its checksum before it is read (load_options::verify_checksums). Returns the
/// file's metadata.
template <class Model, class TpMesh>
std::map<std::string, std::string> load_consolidated(Model& model, TpMesh const& tp, std::filesystem::path const& file,
                                                     std::function<std::string(std::string const&)> const& names = {},
                                                     load_options const& options = {}) {
  return detail::load_mapped(model, tp, file, detail::renaming(names), options, "load_consolidated").metadata;
}

/// Fills a lazily declared, parallelized model from a consolidated file: each rank allocates and reads only its
/// shard. Returns the model, now usable.
template <module Model, class TpMesh>
Model& load_consolidated(Lazy<Model>& lazy, TpMesh const& tp, std::filesystem::path const& file,
                         std::function<std::string(std::string const&)> const& names = {},
                         load_options const& options = {}) {
  (void)load_consolidated(lazy.unmaterialized(), tp, file, names, options);
  return lazy.unmaterialized();
}

}  // namespace shardwise
