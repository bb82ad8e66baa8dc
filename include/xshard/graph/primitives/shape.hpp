#pragma once
/// \file
/// Shape primitives: transpose (attributes ints = the permutation: result dimension d is
/// operand dimension perm[d]) and reshape (ints = the new shape; flatten is a reshape).
///
/// Sharding: transpose permutes the layout with the dimensions (a local permutation of the
/// block). reshape keeps a split first dimension when the first extent does not change (the
/// rows stay on their ranks: [N, C, H, W] -> [N, C H W]); every other dimension is whole. VJPs
/// are the inverse permutation and the reshape back.

#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/elementwise.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard::detail {

inline std::vector<std::size_t> permutation_of(const op_attributes& at, std::size_t r) {
    std::vector<std::size_t> p;
    std::vector<bool> seen(r, false);
    for (auto d : at.ints) {
        if (d < 0 || std::size_t(d) >= r || seen[std::size_t(d)])
            throw std::invalid_argument("the permutation is not one of the operand's " +
                                        std::to_string(r) + " dimensions");
        seen[std::size_t(d)] = true;
        p.push_back(std::size_t(d));
    }
    if (p.size() != r)
        throw std::invalid_argument("the permutation has " + std::to_string(p.size()) +
                                    " dimensions, the operand " + std::to_string(r));
    return p;
}

inline std::vector<result_spec> infer_transpose(const op_attributes& at,
                                                std::span<const operand_type> ops) {
    expect_operands(ops, 1, "transpose");
    const auto p = permutation_of(at, ops[0].shape.size());
    value_shape out;
    for (auto d : p)
        out.push_back(ops[0].shape[d]);
    return {{out, ops[0].type}};
}

inline layout_choice transpose_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                       std::vector<layout> asked, const mesh_shape&) {
    const layout in = whole_terms(asked[0]);
    const auto p = permutation_of(at, ops[0].shape.size());
    layout out = in;
    for (std::size_t d = 0; d < p.size(); ++d)
        out.dims[d] = in.dims[p[d]];
    return {{in}, {out}};
}

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

inline std::vector<result_spec> infer_reshape(const op_attributes& at,
                                              std::span<const operand_type> ops) {
    expect_operands(ops, 1, "reshape");
    value_shape out;
    std::size_t n = 1, m = 1;
    for (auto e : ops[0].shape)
        n *= e;
    for (auto e : at.ints) {
        if (e < 0)
            throw std::invalid_argument("the new shape has a negative extent");
        out.push_back(std::size_t(e));
        m *= std::size_t(e);
    }
    if (n != m)
        throw std::invalid_argument("cannot reshape " + shape_text(ops[0].shape) + " (" +
                                    std::to_string(n) + " elements) to " + shape_text(out));
    return {{out, ops[0].type}};
}

inline layout_choice reshape_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                     std::vector<layout> asked, const mesh_shape&) {
    const auto out_shape = infer_reshape(at, ops)[0].first;
    const auto& in_shape = ops[0].shape;
    layout in = layout::replicated(in_shape.size());
    layout out = layout::replicated(out_shape.size());
    if (!in_shape.empty() && !out_shape.empty() && in_shape[0] == out_shape[0])
        in.dims[0] = out.dims[0] = asked[0].dims[0];
    return {{in}, {out}};
}

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
                                          .saves = 0};
inline constexpr op_rules reshape_rules{.name = "reshape",
                                        .infer = infer_reshape,
                                        .rule = reshape_layouts,
                                        .batched = reshape_batched,
                                        .resolve = resolve_each,
                                        .flops = no_flops,
                                        .saves = 0};

template <class T>
void register_shape(auto&& add) {
    add(primitive<T>{&transpose_rules, transpose_forward<T>, transpose_vjp<T>});
    add(primitive<T>{&reshape_rules, copy_forward<T>, copy_vjp<T>});
}

} // namespace xshard::detail
