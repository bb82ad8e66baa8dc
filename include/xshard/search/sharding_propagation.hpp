#pragma once
/// \file
/// MindSpore's `sharding_propagation` parallel mode: operators given a strategy keep it, the
/// others get theirs from their neighbours, by minimising the strategy search's cost model
/// (search/cost.hpp) along the chain of a sequential network for the objective `level` (0
/// least communication, 1 least memory, 2 fastest; core/objective.hpp). It is the search's
/// dynamic programme (search/search_degrees.hpp) with the given operators pinned, on the
/// degrees the run has, so a completed chain is the cheapest one through the given strategies:
///
///     std::vector<std::optional<xshard::op_choice>> given(net.ops.size());
///     given[0] = xshard::op_choice{rows, weight_split::output, features};   // column parallel
///     auto plan = xshard::propagate_strategies(net, {.dp = 2, .tp = 2}, given);
///
/// The operations inside `shard()` are any callable's, not a chain of operators this cost
/// model knows: there the option `xshard::sharding_propagation{level}` derives the `none`
/// specs by running the candidates (shard/derivation.hpp).

#include <xshard/compiled.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/redistribution_pricer.hpp>
#include <xshard/search/search_degrees.hpp>
#include <xshard/search/search_options.hpp>
#include <xshard/search/searched_strategy.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard {

/// The strategies of every operator of `net` on degrees `d`: `given[i]` where set, the cheapest
/// completion by the objective of `o` elsewhere (`o.degrees` and `o.fixed` are replaced).
/// Throws std::invalid_argument when the given strategies cannot be completed (an operator's
/// strategy that does not suit it, or neighbours that cannot meet).
XSHARD_DECL searched_strategy
propagate_strategies(const network_spec& net, const parallel_degrees& d,
                     const std::vector<std::optional<op_choice>>& given, search_options o = {});

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/sharding_propagation.ipp>
#endif
