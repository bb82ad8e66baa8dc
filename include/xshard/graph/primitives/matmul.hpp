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
inline value_shape as_multiplied(value_shape s, bool t) {
    if (t && s.size() >= 2)
        std::swap(s[s.size() - 2], s[s.size() - 1]);
    return s;
}

inline layout as_multiplied(layout l, bool t) { return t ? swap_last_two(l) : l; }

inline std::vector<result_spec> infer_matmul(const op_attributes& at,
                                             std::span<const operand_type> ops) {
    expect_operands(ops, 2, "matmul");
    expect_floating(ops, 0, "matmul");
    expect_floating(ops, 1, "matmul");
    if (ops[0].type != ops[1].type)
        throw std::invalid_argument("the operands have different element types");
    const matmul_flags f(at);
    const auto a = as_multiplied(ops[0].shape, f.ta), b = as_multiplied(ops[1].shape, f.tb);
    const std::size_t ra = a.size(), rb = b.size();
    bool fits = ra >= 2 && (rb == 2 || rb == ra) && a[ra - 1] == b[rb - 2];
    for (std::size_t d = 0; fits && rb == ra && d + 2 < ra; ++d)
        fits = a[d] == b[d];
    if (!fits)
        throw std::invalid_argument("shapes " + shape_text(ops[0].shape) + " and " +
                                    shape_text(ops[1].shape) + " do not multiply" +
                                    (f.ta || f.tb ? " (as transposed)" : ""));
    value_shape out = a;
    out[ra - 1] = b[rb - 1];
    return {{out, ops[0].type}};
}

inline layout_choice matmul_layouts(const op_attributes& at, std::span<const operand_type>,
                                    std::vector<layout> asked, const mesh_shape&) {
    const matmul_flags f(at);
    const auto r = matmul_rule(as_multiplied(whole_terms(asked[0]), f.ta),
                               as_multiplied(whole_terms(asked[1]), f.tb));
    if (r.problem == rule_problem::rank_mismatch)
        throw std::invalid_argument("the operands' ranks do not multiply");
    return {{as_multiplied(r.a, f.ta), as_multiplied(r.b, f.tb)}, {r.out}};
}

inline bool matmul_batched(const op_attributes&, std::span<const operand_type> ops,
                           std::size_t i) {
    return !ops[i].is_weight && (i == 0 || ops[i].shape.size() >= 3);
}

inline std::vector<layout> matmul_resolve(std::span<const strategy> s, const mesh_shape& mesh) {
    if (s.size() != 2 || s[0].rank() != s[1].rank())
        return resolve_each(s, mesh);
    try {
        const auto m = resolve_matmul(s[0], s[1], mesh);
        return {m.x, m.w};
    } catch (const std::invalid_argument& e) {
        // "xshard: MatMul strategy ...": the caller names the node.
        std::string what = e.what();
        if (what.rfind("xshard: ", 0) == 0)
            what = what.substr(8);
        throw std::invalid_argument(what);
    }
}

/// m, n, k and the batch count of this rank's product.
struct gemm_dims {
    std::size_t m = 0, n = 0, k = 0, batches = 0;
    bool b_batched = false;
};

inline gemm_dims local_gemm(const node_shards& s, const matmul_flags& f) {
    const auto a = as_multiplied(s.operands[0].local, f.ta);
    const auto b = as_multiplied(s.operands[1].local, f.tb);
    gemm_dims g;
    g.m = a[a.size() - 2];
    g.k = a[a.size() - 1];
    g.n = b[b.size() - 1];
    g.batches = 1;
    for (std::size_t d = 0; d + 2 < a.size(); ++d)
        g.batches *= a[d];
    g.b_batched = b.size() == a.size() && a.size() > 2;
    return g;
}

inline double matmul_flops(const op_attributes& at, std::span<const shard_type> ops,
                           std::span<const shard_type>) {
    node_shards s;
    s.operands.assign(ops.begin(), ops.end());
    const auto g = local_gemm(s, matmul_flags(at));
    return 2.0 * double(g.m) * double(g.n) * double(g.k) * double(g.batches);
}

/// The smallest of this rank's m, n and k: each of the forward and backward products
/// multiplies over the same three extents.
inline double matmul_gemm_dimension(const op_attributes& at, std::span<const shard_type> ops,
                                    std::span<const shard_type>) {
    node_shards s;
    s.operands.assign(ops.begin(), ops.end());
    const auto g = local_gemm(s, matmul_flags(at));
    return double(std::min({g.m, g.n, g.k}));
}

inline constexpr op_rules matmul_rules{.name = "matmul",
                                       .infer = infer_matmul,
                                       .rule = matmul_layouts,
                                       .batched = matmul_batched,
                                       .resolve = matmul_resolve,
                                       .flops = matmul_flops,
                                       .gemm_dimension = matmul_gemm_dimension,
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
