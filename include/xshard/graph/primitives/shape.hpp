#pragma once
/// \file
/// Shape primitives: transpose (attributes ints = the permutation: result dimension d is
/// operand dimension perm[d]), reshape (ints = the new shape; flatten is a reshape), slice
/// (ints = {dim, begin, end}) and concat (ints = {dim}: its operands one after another along
/// dimension dim).
///
/// Sharding: transpose permutes the layout with the dimensions (a local permutation of the
/// block). reshape keeps the split of an operand dimension where a result dimension starts at
/// the same element stride and both extents divide by the split count (then every rank's block
/// is the same elements in the same order: [T, 3F] [dp, tp] -> [B, S, H, 3d] [dp, -, tp, -]);
/// other splits are gathered first. slice and concat take their dimension whole (every operand
/// of concat laid out alike). VJPs are the inverse permutation, the reshape back, the
/// cotangent placed in the slice (zeros elsewhere), and each operand's slice of the concat's
/// cotangent.

#include <xshard/compiled.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/elementwise.hpp>
#include <xshard/graph/primitives/normalize.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard::detail {

XSHARD_DECL std::vector<std::size_t> permutation_of(const op_attributes& at, std::size_t r);

XSHARD_DECL std::vector<result_spec> infer_transpose(const op_attributes& at,
                                                     std::span<const operand_type> ops);

XSHARD_DECL layout_choice transpose_layouts(const op_attributes& at,
                                            std::span<const operand_type> ops,
                                            std::vector<layout> asked, const mesh_shape&);

inline bool transpose_batched(const op_attributes& at, std::span<const operand_type> ops,
                              std::size_t) {
    return !ops[0].is_weight && !at.ints.empty() && at.ints[0] == 0;
}

/// y[i_0, ..] = x[i_p^-1...]: result dimension d walks operand dimension perm[d]. With
/// `add`, adds instead of writing.
template <class T>
void permute(const T* x, const value_shape& xs, const std::vector<std::size_t>& perm, T* y,
             bool add) {
    const std::size_t r = xs.size();
    std::array<std::size_t, max_tensor_rank> xstride{}, ystride{}, extent{}, idx{};
    std::size_t s = 1;
    for (std::size_t d = r; d-- > 0;) {
        xstride[d] = s;
        s *= xs[d];
    }
    const std::size_t total = s;
    for (std::size_t d = 0; d < r; ++d) {
        extent[d] = xs[perm[d]];
        ystride[d] = xstride[perm[d]]; // result dim d steps the operand by this
    }
    std::size_t at = 0;
    for (std::size_t o = 0; o < total; ++o) {
        y[o] = add ? y[o] + x[at] : x[at];
        for (std::size_t d = r; d-- > 0;) {
            ++idx[d];
            at += ystride[d];
            if (idx[d] < extent[d])
                break;
            at -= ystride[d] * extent[d];
            idx[d] = 0;
        }
    }
}

template <class T>
void transpose_forward(const forward_args& x) {
    const auto& s = x.shards;
    permute(static_cast<const T*>(x.operands[0]), s.operands[0].local,
            permutation_of(s.node->attributes, s.operands[0].rank()), static_cast<T*>(x.results[0]),
            false);
}

template <class T>
void transpose_vjp(const vjp_args& v) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    const auto& s = v.shards;
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    if (!dy) {
        if (!v.accumulate[0])
            std::fill_n(dx, s.operands[0].count(), T(0));
        return;
    }
    const auto p = permutation_of(s.node->attributes, s.operands[0].rank());
    std::vector<std::size_t> inverse(p.size());
    for (std::size_t d = 0; d < p.size(); ++d)
        inverse[p[d]] = d;
    permute(dy, s.results[0].local, inverse, dx, v.accumulate[0]);
}

XSHARD_DECL std::vector<result_spec> infer_reshape(const op_attributes& at,
                                                   std::span<const operand_type> ops);

XSHARD_DECL layout_choice reshape_layouts(const op_attributes& at,
                                          std::span<const operand_type> ops,
                                          std::vector<layout> asked, const mesh_shape& mesh);

inline bool reshape_batched(const op_attributes& at, std::span<const operand_type> ops,
                            std::size_t) {
    return !ops[0].is_weight && !ops[0].shape.empty() && !at.ints.empty() &&
           std::size_t(at.ints[0]) == ops[0].shape[0];
}

template <class T>
void copy_forward(const forward_args& x) {
    std::memcpy(x.results[0], x.operands[0], x.shards.results[0].count() * sizeof(T));
}

template <class T>
void copy_vjp(const vjp_args& v) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    const std::size_t n = v.shards.operands[0].count();
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    if (v.accumulate[0]) {
        for (std::size_t i = 0; dy && i < n; ++i)
            dx[i] += dy[i];
    } else if (dy) {
        std::memcpy(dx, dy, n * sizeof(T));
    } else {
        std::fill_n(dx, n, T(0));
    }
}

// Slice.

struct slice_range {
    std::size_t dim = 0, begin = 0, end = 0;
};

XSHARD_DECL slice_range slice_of(const op_attributes& at, const value_shape& s);

XSHARD_DECL std::vector<result_spec> infer_slice(const op_attributes& at,
                                                 std::span<const operand_type> ops);

XSHARD_DECL layout_choice slice_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                        std::vector<layout> asked, const mesh_shape&);

/// Calls f(operand offset, result offset, n) for each contiguous run of the slice.
template <class F>
void slice_runs(const node_shards& s, F f) {
    const auto r = slice_of(s.node->attributes, s.operands[0].global);
    const rows_around in(s.operands[0].local, r.dim), out(s.results[0].local, r.dim);
    for (std::size_t o = 0; o < in.outer; ++o)
        f((o * in.n + r.begin) * in.inner, o * out.n * out.inner, out.n * out.inner);
}

template <class T>
void slice_forward(const forward_args& x) {
    const T* a = static_cast<const T*>(x.operands[0]);
    T* y = static_cast<T*>(x.results[0]);
    slice_runs(x.shards, [&](std::size_t from, std::size_t to, std::size_t n) {
        std::copy_n(a + from, n, y + to);
    });
}

template <class T>
void slice_vjp(const vjp_args& v) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    if (!v.accumulate[0])
        std::fill_n(dx, v.shards.operands[0].count(), T(0));
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    if (!dy)
        return;
    slice_runs(v.shards, [&](std::size_t from, std::size_t to, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i)
            dx[from + i] += dy[to + i];
    });
}

// Concat.

XSHARD_DECL std::size_t concat_dim(const op_attributes& at, std::size_t rank);

XSHARD_DECL std::vector<result_spec> infer_concat(const op_attributes& at,
                                                  std::span<const operand_type> ops);

XSHARD_DECL layout_choice concat_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape&);

inline bool concat_batched(const op_attributes& at, std::span<const operand_type> ops,
                           std::size_t i) {
    return !ops[i].is_weight && ops[i].shape.size() > 1 && concat_dim(at, ops[i].shape.size()) != 0;
}

/// Calls f(operand, operand offset, result offset, n) for each contiguous run of each operand
/// in the result.
template <class F>
void concat_runs(const node_shards& s, F f) {
    const auto d = concat_dim(s.node->attributes, s.results[0].rank());
    const rows_around out(s.results[0].local, d);
    std::size_t at = 0;
    for (std::size_t k = 0; k < s.operands.size(); ++k) {
        const rows_around in(s.operands[k].local, d);
        for (std::size_t o = 0; o < in.outer; ++o)
            f(k, o * in.n * in.inner, (o * out.n + at) * out.inner, in.n * in.inner);
        at += in.n;
    }
}

template <class T>
void concat_forward(const forward_args& x) {
    T* y = static_cast<T*>(x.results[0]);
    concat_runs(x.shards, [&](std::size_t k, std::size_t from, std::size_t to, std::size_t n) {
        std::copy_n(static_cast<const T*>(x.operands[k]) + from, n, y + to);
    });
}

template <class T>
void concat_vjp(const vjp_args& v) {
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    for (std::size_t k = 0; k < v.operand_cotangents.size(); ++k)
        if (v.operand_cotangents[k] && !v.accumulate[k])
            std::fill_n(static_cast<T*>(v.operand_cotangents[k]), v.shards.operands[k].count(),
                        T(0));
    if (!dy)
        return;
    concat_runs(v.shards, [&](std::size_t k, std::size_t to, std::size_t from, std::size_t n) {
        if (T* dx = static_cast<T*>(v.operand_cotangents[k]))
            for (std::size_t i = 0; i < n; ++i)
                dx[to + i] += dy[from + i];
    });
}

inline double no_flops(const op_attributes&, std::span<const shard_type>,
                       std::span<const shard_type>) {
    return 0;
}

inline constexpr op_rules transpose_rules{.name = "transpose",
                                          .infer = infer_transpose,
                                          .rule = transpose_layouts,
                                          .batched = transpose_batched,
                                          .resolve = resolve_each,
                                          .flops = no_flops,
                                          .saves = 0,
                                          .follows = true};
inline constexpr op_rules reshape_rules{.name = "reshape",
                                        .infer = infer_reshape,
                                        .rule = reshape_layouts,
                                        .batched = reshape_batched,
                                        .resolve = resolve_each,
                                        .flops = no_flops,
                                        .saves = 0,
                                        .follows = true};

inline constexpr op_rules slice_rules{.name = "slice",
                                      .infer = infer_slice,
                                      .rule = slice_layouts,
                                      .batched = first_batched,
                                      .resolve = resolve_each,
                                      .flops = no_flops,
                                      .saves = 0,
                                      .follows = true};

inline constexpr op_rules concat_rules{.name = "concat",
                                       .infer = infer_concat,
                                       .rule = concat_layouts,
                                       .batched = concat_batched,
                                       .resolve = resolve_each,
                                       .flops = no_flops,
                                       .saves = 0,
                                       .follows = true};

template <class T>
void register_shape(auto&& add) {
    add(primitive<T>{&concat_rules, concat_forward<T>, concat_vjp<T>});
    add(primitive<T>{&slice_rules, slice_forward<T>, slice_vjp<T>});
    add(primitive<T>{&transpose_rules, transpose_forward<T>, transpose_vjp<T>});
    add(primitive<T>{&reshape_rules, copy_forward<T>, copy_vjp<T>});
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitives/shape.ipp>
#endif
