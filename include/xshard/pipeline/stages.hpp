#pragma once
/// \file
/// Which (virtual) stage each layer of a chain runs on: by module name (MindSpore's
/// `stage_config`), by position (the index where each stage starts), or balanced by cost
/// (parameters per layer; for dense layers a layer's FLOPs are 2 x rows x parameters, so
/// the same cut). Pure functions of sizes and names, the same on every rank; misuse throws
/// `xshard::error` with a sentence.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xshard::pipeline {

namespace detail {

XSHARD_DECL std::string name_list(const std::vector<std::string>& names);

/// Throws unless `stage_of` runs along the chain (never back) and gives every stage of
/// 0 .. stages - 1 at least one layer.
XSHARD_DECL void check_stages(const std::vector<std::string>& names,
                              const std::vector<int>& stage_of, int stages);

} // namespace detail

namespace detail {

/// Whether module path `key` covers module `name`: the same module, or one of its ancestors
/// ("backbone" covers "backbone.layer1"); the empty path covers every module.
inline bool covers(std::string_view key, std::string_view name) {
    return key.empty() || name == key ||
           (name.size() > key.size() && name.starts_with(key) && name[key.size()] == '.');
}

/// The forms of a stage_config key to look up, in order: the key itself, then without
/// MindSpore's WithLossCell prefix ("_backbone.layer1" is "layer1", "_backbone" the network).
XSHARD_DECL std::vector<std::string_view> key_forms(std::string_view key);

} // namespace detail

/// Stages from names (MindSpore's stage_config): `config[path]` is the stage of the modules
/// that dotted path names, at any depth, with or without MindSpore's "_backbone." prefix:
///  * a chain module ("layer1"), or an ancestor of chain modules ("backbone" for
///    "backbone.layer1", "backbone.layer2"): each of them, the most specific path winning;
///  * a part of one chain module ("layer1.dense"): that module, unless other parts of it are
///    given other stages (a pipeline cuts between the chain's modules only: that raises).
/// A module not named takes the stage of the one before it (the first, stage 0). Throws for
/// a path that names no module of the chain, and (see check_stages) for stages that go back
/// or stay empty.
XSHARD_DECL std::vector<int> stages_by_name(const std::vector<std::string>& names,
                                            const std::map<std::string, int>& config, int stages);

/// Stages by position: stage s starts at layer `starts[s - 1]` (stage 0 at layer 0), so
/// `starts` has stages - 1 increasing entries.
XSHARD_DECL std::vector<int> stages_by_position(const std::vector<std::string>& names,
                                                const std::vector<std::size_t>& starts, int stages);

/// Stages balanced by cost: the cut of the chain into `stages` non-empty runs whose largest
/// total cost is smallest (ties: the earliest cuts). Throws when there are fewer layers than
/// stages.
XSHARD_DECL std::vector<int> stages_by_cost(const std::vector<std::string>& names,
                                            const std::vector<double>& cost, int stages);

} // namespace xshard::pipeline

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/pipeline/stages.ipp>
#endif
