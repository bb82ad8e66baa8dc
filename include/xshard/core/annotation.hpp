#pragma once
/// \file
/// What an operation is told beyond its operands: its attributes (axes, shapes, epsilons)
/// and MindSpore's per-operator `.shard(...)` annotation (strategies or layouts). Operations
/// of `xshard::ops` carry both into a traced program (graph/), where a node keeps them.

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/strategy.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace xshard {

/// The attributes of an operation: integers (axes, permutations, shapes, strides) and reals
/// (epsilons, scales), in the order its primitive documents.
struct op_attributes {
    std::vector<std::int64_t> ints;
    std::vector<double> reals;
    friend bool operator==(const op_attributes&, const op_attributes&) = default;
};

/// MindSpore's `.shard(...)` of one operation: a strategy per operand (its `in_strategy`),
/// or a layout per operand, and optionally a layout per result (its `out_strategy`: the
/// result is redistributed to it right after the operation).
struct op_annotation {
    std::vector<strategy> in_strategies;
    std::vector<layout> in_layouts;
    std::vector<layout> out_layouts;

    bool empty() const { return in_strategies.empty() && in_layouts.empty() && out_layouts.empty(); }

    /// "((2, 4), (4, 1))", or the layouts.
    std::string to_string() const;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/core/annotation.ipp>
#endif
