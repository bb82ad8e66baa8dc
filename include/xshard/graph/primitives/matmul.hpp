#pragma once
/// \file
/// The matmul primitive: a [batch.., i, k] @ b [batch.., k, j] (or b [k, j]), with either
/// operand stored transposed (attributes ints = {transpose_a, transpose_b}, both 0 by
/// default; a transposed operand is stored [.., k, i], resp. [.., j, k]).
///
/// Sharding: ops/rules.hpp's `matmul_rule` on the operands as multiplied: a split
/// contraction leaves the product a pending sum over its axes (resolved on the edge to the
/// consumer that needs it). MindSpore's strategies ((a, b), (b, c)) resolve together on the
/// device matrix [a, b, c] (`resolve_matmul`). Kernel: one BLAS gemm per batch element. VJP:
/// da = dy b^T and db = a^T dy, local gemms whose results are each rank's terms of the
/// operands' cotangents (no communication).

#include <xshard/compiled.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/rules.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace xshard::detail {

struct matmul_flags {
    bool ta = false, tb = false;
    explicit matmul_flags(const op_attributes& at)
        : ta(at.ints.size() > 0 && at.ints[0] != 0)
        , tb(at.ints.size() > 1 && at.ints[1] != 0) {}
};

/// A shape with its last two dimensions swapped when `t`.
XSHARD_DECL value_shape as_multiplied(value_shape s, bool t);

inline layout as_multiplied(layout l, bool t) { return t ? swap_last_two(l) : l; }

XSHARD_DECL std::vector<result_spec> infer_matmul(const op_attributes& at,
                                                  std::span<const operand_type> ops);

XSHARD_DECL layout_choice matmul_layouts(const op_attributes& at, std::span<const operand_type>,
                                         std::vector<layout> asked, const mesh_shape&);

inline bool matmul_batched(const op_attributes&, std::span<const operand_type> ops,
                           std::size_t i) {
    return !ops[i].is_weight && (i == 0 || ops[i].shape.size() >= 3);
}

XSHARD_DECL std::vector<layout> matmul_resolve(std::span<const strategy> s, const mesh_shape& mesh);

/// m, n, k and the batch count of this rank's product.
struct gemm_dims {
    std::size_t m = 0, n = 0, k = 0, batches = 0;
    bool b_batched = false;
};

XSHARD_DECL gemm_dims local_gemm(const node_shards& s, const matmul_flags& f);

XSHARD_DECL double matmul_flops(const op_attributes& at, std::span<const shard_type> ops,
                                std::span<const shard_type>);

/// The smallest of this rank's m, n and k: each of the forward and backward products
/// multiplies over the same three extents.
XSHARD_DECL double matmul_gemm_dimension(const op_attributes& at, std::span<const shard_type> ops,
                                         std::span<const shard_type>);

/// A GEMM streams its operands and its result within its arithmetic, at the rate
/// `measure_machine` measured on GEMMs that stream theirs: the search prices no passes of
/// memory beside it.
inline constexpr op_rules matmul_rules{.name = "matmul",
                                       .infer = infer_matmul,
                                       .rule = matmul_layouts,
                                       .batched = matmul_batched,
                                       .resolve = matmul_resolve,
                                       .flops = matmul_flops,
                                       .gemm_dimension = matmul_gemm_dimension,
                                       .passes = 0,
                                       .backward_passes = 0,
                                       .saves = saves_operand(0) | saves_operand(1)};

template <class T>
void matmul_forward(const forward_args& x) {
    const matmul_flags f(x.shards.node->attributes);
    const auto g = local_gemm(x.shards, f);
    const T* a = static_cast<const T*>(x.operands[0]);
    const T* b = static_cast<const T*>(x.operands[1]);
    T* y = static_cast<T*>(x.results[0]);
    for (std::size_t i = 0; i < g.batches; ++i)
        gemm(f.ta, f.tb, g.m, g.n, g.k, a + i * g.m * g.k, f.ta ? g.m : g.k,
             b + (g.b_batched ? i * g.k * g.n : 0), f.tb ? g.k : g.n, false, y + i * g.m * g.n,
             g.n);
}

template <class T>
void matmul_vjp(const vjp_args& v) {
    const matmul_flags f(v.shards.node->attributes);
    const auto g = local_gemm(v.shards, f);
    const T* a = static_cast<const T*>(v.operands[0]);
    const T* b = static_cast<const T*>(v.operands[1]);
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    T* da = static_cast<T*>(v.operand_cotangents[0]);
    T* db = static_cast<T*>(v.operand_cotangents[1]);
    if (!dy) {
        if (da && !v.accumulate[0])
            std::fill_n(da, v.shards.operands[0].count(), T(0));
        if (db && !v.accumulate[1])
            std::fill_n(db, v.shards.operands[1].count(), T(0));
        return;
    }
    const std::size_t mk = g.m * g.k, kn = g.k * g.n, mn = g.m * g.n;
    for (std::size_t i = 0; i < g.batches; ++i) {
        const T* ai = a + i * mk;
        const T* bi = b + (g.b_batched ? i * kn : 0);
        const T* gi = dy + i * mn;
        if (da) {
            // a [m, k]: dy [m, n] b^T; a stored [k, m]: b dy^T.
            if (f.ta)
                gemm(f.tb, true, g.k, g.m, g.n, bi, f.tb ? g.k : g.n, gi, g.n, v.accumulate[0],
                     da + i * mk, g.m);
            else
                gemm(false, !f.tb, g.m, g.k, g.n, gi, g.n, bi, f.tb ? g.k : g.n, v.accumulate[0],
                     da + i * mk, g.k);
        }
        if (db) {
            // b [k, n]: a^T dy; b stored [n, k]: dy^T a. A b shared by every batch element
            // sums their products.
            const bool add = v.accumulate[1] || (!g.b_batched && i > 0);
            T* out = db + (g.b_batched ? i * kn : 0);
            if (f.tb)
                gemm(true, f.ta, g.n, g.k, g.m, gi, g.n, ai, f.ta ? g.m : g.k, add, out, g.k);
            else
                gemm(!f.ta, false, g.k, g.n, g.m, ai, f.ta ? g.m : g.k, gi, g.n, add, out, g.n);
        }
    }
    if (g.batches == 0) {
        if (da && !v.accumulate[0])
            std::fill_n(da, v.shards.operands[0].count(), T(0));
        if (db && !v.accumulate[1])
            std::fill_n(db, v.shards.operands[1].count(), T(0));
    }
}

template <class T>
void register_matmul(auto&& add) {
    add(primitive<T>{&matmul_rules, matmul_forward<T>, matmul_vjp<T>});
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitives/matmul.ipp>
#endif
