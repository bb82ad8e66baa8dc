#pragma once
/// \file
/// Reductions: sum, mean, max and min over a set of dimensions (attributes ints =
/// {keepdims, dims...}; no dims: over every dimension, a scalar).
///
/// Sharding: sum and mean over a split dimension leave a pending sum over its axes (each
/// rank sums its block; resolved on the edge to a consumer that needs the whole value, one
/// all-reduce). max and min take their reduced dimensions whole (the VJP compares with the
/// complete extremum). VJPs: the cotangent broadcast back (divided by the count for mean;
/// for max and min, to the elements equal to the extremum).

#include <xshard/compiled.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/elementwise.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard::detail {

/// The reduced dimensions of a node on an operand of rank `r` (every one when none is named).
XSHARD_DECL std::vector<bool> reduced_dims(const op_attributes& at, std::size_t r);

inline bool keeps_dims(const op_attributes& at) { return !at.ints.empty() && at.ints[0] != 0; }

/// The shape with the reduced dimensions dropped (kept as 1 with keepdims).
XSHARD_DECL value_shape reduced_shape(const value_shape& s, const std::vector<bool>& red,
                                      bool keep);

XSHARD_DECL std::vector<result_spec> infer_reduce(const op_attributes& at,
                                                  std::span<const operand_type> ops);

template <bool Linear>
layout_choice reduce_layouts(const op_attributes& at, std::span<const operand_type> ops,
                             std::vector<layout> asked, const mesh_shape&) {
    layout in = whole_terms(asked[0]);
    const auto red = reduced_dims(at, ops[0].shape.size());
    layout out;
    for (std::size_t d = 0; d < in.rank(); ++d) {
        if (!red[d]) {
            out.dims.push_back(in.dims[d]);
            continue;
        }
        if (Linear)
            for (const auto& a : in.dims[d])
                out.partial.push_back(a);
        else
            in.dims[d] = {};
        if (keeps_dims(at))
            out.dims.push_back({});
    }
    return {{in}, {out}};
}

inline double reduce_flops(const op_attributes&, std::span<const shard_type> ops,
                           std::span<const shard_type>) {
    return double(ops[0].count());
}

constexpr op_rules reduce_rules(std::string_view name, bool linear, std::uint32_t saves) {
    return {.name = name,
            .infer = infer_reduce,
            .rule = linear ? reduce_layouts<true> : reduce_layouts<false>,
            .batched = first_batched,
            .resolve = resolve_each,
            .flops = reduce_flops,
            .saves = saves};
}

inline constexpr op_rules sum_rules = reduce_rules("sum", true, 0);
inline constexpr op_rules mean_rules = reduce_rules("mean", true, 0);
inline constexpr op_rules max_rules =
    reduce_rules("max", false, saves_operand(0) | saves_result(0));
inline constexpr op_rules min_rules =
    reduce_rules("min", false, saves_operand(0) | saves_result(0));

/// The walk over the operand's local elements with the offset of each one's result element.
XSHARD_DECL broadcast_walk<1> reduce_walk(const node_shards& s);

/// The number of elements of the whole operand that each result element reduces.
XSHARD_DECL double reduce_count(const node_shards& s);

template <class T, class Op>
void reduce_forward(const forward_args& x, T start, Op op, bool mean) {
    const T* a = static_cast<const T*>(x.operands[0]);
    T* y = static_cast<T*>(x.results[0]);
    std::fill_n(y, x.shards.results[0].count(), start);
    const auto w = reduce_walk(x.shards);
    const std::size_t s = w.step(0);
    w.run([&](std::size_t o, const auto& at, std::size_t n) {
        for (std::size_t j = 0; j < n; ++j)
            y[at[0] + j * s] = op(y[at[0] + j * s], a[o + j]);
    });
    if (mean) {
        const T c = T(1.0 / reduce_count(x.shards));
        for (std::size_t i = 0; i < x.shards.results[0].count(); ++i)
            y[i] *= c;
    }
}

/// dx = dy broadcast, times `factor` (mean: 1 / count), only where `pick(x, y)` (extrema).
template <class T, class Pick>
void reduce_vjp(const vjp_args& v, T factor, Pick pick) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    const T* a = static_cast<const T*>(v.operands[0]);
    const T* y = static_cast<const T*>(v.results[0]);
    const std::size_t count = v.shards.operands[0].count();
    if (!dy) {
        if (!v.accumulate[0])
            std::fill_n(dx, count, T(0));
        return;
    }
    const auto w = reduce_walk(v.shards);
    const std::size_t s = w.step(0);
    const bool add = v.accumulate[0];
    w.run([&](std::size_t o, const auto& at, std::size_t n) {
        for (std::size_t j = 0; j < n; ++j) {
            const std::size_t r = at[0] + j * s;
            const T g = pick(a ? a[o + j] : T(0), y ? y[r] : T(0)) ? factor * dy[r] : T(0);
            dx[o + j] = add ? dx[o + j] + g : g;
        }
    });
}

template <class T>
void register_reduce(auto&& add) {
    using A = const forward_args&;
    using V = const vjp_args&;
    auto always = [](T, T) { return true; };
    auto equal = [](T x, T y) { return x == y; };
    add(primitive<T>{&sum_rules,
                     [](A x) { reduce_forward<T>(x, T(0), [](T s, T e) { return s + e; }, false); },
                     [](V v) { reduce_vjp<T>(v, T(1), decltype(always){}); }});
    add(primitive<T>{&mean_rules,
                     [](A x) { reduce_forward<T>(x, T(0), [](T s, T e) { return s + e; }, true); },
                     [](V v) {
                         reduce_vjp<T>(v, T(1.0 / reduce_count(v.shards)), decltype(always){});
                     }});
    add(primitive<T>{&max_rules,
                     [](A x) {
                         reduce_forward<T>(x, -std::numeric_limits<T>::infinity(),
                                           [](T s, T e) { return e > s ? e : s; }, false);
                     },
                     [](V v) { reduce_vjp<T>(v, T(1), decltype(equal){}); }});
    add(primitive<T>{&min_rules,
                     [](A x) {
                         reduce_forward<T>(x, std::numeric_limits<T>::infinity(),
                                           [](T s, T e) { return e < s ? e : s; }, false);
                     },
                     [](V v) { reduce_vjp<T>(v, T(1), decltype(equal){}); }});
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitives/reduce.ipp>
#endif
