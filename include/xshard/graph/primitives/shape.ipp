#pragma once
/// \file
/// The definitions of what graph/primitives/shape.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitives/shape.hpp>

namespace xshard::detail {

XSHARD_DECL std::vector<std::size_t> permutation_of(const op_attributes& at, std::size_t r) {
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

XSHARD_DECL std::vector<result_spec> infer_transpose(const op_attributes& at,
                                                     std::span<const operand_type> ops) {
    expect_operands(ops, 1, "transpose");
    const auto p = permutation_of(at, ops[0].shape.size());
    value_shape out;
    for (auto d : p)
        out.push_back(ops[0].shape[d]);
    return {{out, ops[0].type}};
}

XSHARD_DECL layout_choice transpose_layouts(const op_attributes& at,
                                            std::span<const operand_type> ops,
                                            std::vector<layout> asked, const mesh_shape&) {
    const layout in = whole_terms(asked[0]);
    const auto p = permutation_of(at, ops[0].shape.size());
    layout out = in;
    for (std::size_t d = 0; d < p.size(); ++d)
        out.dims[d] = in.dims[p[d]];
    return {{in}, {out}};
}

XSHARD_DECL std::vector<result_spec> infer_reshape(const op_attributes& at,
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

XSHARD_DECL layout_choice reshape_layouts(const op_attributes& at,
                                          std::span<const operand_type> ops,
                                          std::vector<layout> asked, const mesh_shape& mesh) {
    const auto out_shape = infer_reshape(at, ops)[0].first;
    const auto& in_shape = ops[0].shape;
    layout in = whole_terms(asked[0]);
    layout out = layout::replicated(out_shape.size());
    // The element stride at which each result dimension starts.
    std::vector<std::size_t> starts(out_shape.size());
    std::size_t prefix = 1;
    for (std::size_t j = 0; j < out_shape.size(); ++j) {
        starts[j] = prefix;
        prefix *= out_shape[j];
    }
    prefix = 1;
    for (std::size_t i = 0; i < in_shape.size(); ++i) {
        const auto k = std::size_t(in.split_count(i, mesh));
        bool follows = false;
        for (std::size_t j = 0; j < out_shape.size() && k > 1; ++j)
            if (starts[j] == prefix && out_shape[j] % k == 0 && in_shape[i] % k == 0 &&
                out.dims[j].empty()) {
                out.dims[j] = in.dims[i];
                follows = true;
                break;
            }
        if (!follows)
            in.dims[i] = {};
        prefix *= in_shape[i];
    }
    return {{in}, {out}};
}

XSHARD_DECL slice_range slice_of(const op_attributes& at, const value_shape& s) {
    if (at.ints.size() != 3)
        throw std::invalid_argument("slice takes {dim, begin, end}");
    std::int64_t d = at.ints[0];
    if (d < 0)
        d += std::int64_t(s.size());
    if (d < 0 || std::size_t(d) >= s.size() || at.ints[1] < 0 || at.ints[2] < at.ints[1] ||
        std::size_t(at.ints[2]) > s[std::size_t(d)])
        throw std::invalid_argument("the slice [" + std::to_string(at.ints[1]) + ", " +
                                    std::to_string(at.ints[2]) + ") of dimension " +
                                    std::to_string(at.ints[0]) + " does not fit " + shape_text(s));
    return {std::size_t(d), std::size_t(at.ints[1]), std::size_t(at.ints[2])};
}

XSHARD_DECL std::vector<result_spec> infer_slice(const op_attributes& at,
                                                 std::span<const operand_type> ops) {
    expect_operands(ops, 1, "slice");
    const auto r = slice_of(at, ops[0].shape);
    value_shape out = ops[0].shape;
    out[r.dim] = r.end - r.begin;
    return {{out, ops[0].type}};
}

XSHARD_DECL layout_choice slice_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                        std::vector<layout> asked, const mesh_shape&) {
    layout l = whole_terms(asked[0]);
    l.dims[slice_of(at, ops[0].shape).dim] = {};
    return {{l}, {l}};
}

XSHARD_DECL std::size_t concat_dim(const op_attributes& at, std::size_t rank) {
    if (at.ints.size() != 1)
        throw std::invalid_argument("concat takes {dim}");
    std::int64_t d = at.ints[0];
    if (d < 0)
        d += std::int64_t(rank);
    if (d < 0 || std::size_t(d) >= rank)
        throw std::invalid_argument("concat: dimension " + std::to_string(at.ints[0]) +
                                    " of operands of " + std::to_string(rank) + " dimensions");
    return std::size_t(d);
}

XSHARD_DECL std::vector<result_spec> infer_concat(const op_attributes& at,
                                                  std::span<const operand_type> ops) {
    if (ops.empty())
        throw std::invalid_argument("concat takes one operand or more");
    const auto d = concat_dim(at, ops[0].shape.size());
    value_shape out = ops[0].shape;
    out[d] = 0;
    for (const auto& o : ops) {
        auto same = o.shape;
        if (same.size() == out.size())
            same[d] = 0;
        if (same != out || o.type != ops[0].type)
            throw std::invalid_argument("concat along dimension " + std::to_string(d) + ": " +
                                        shape_text(o.shape) + " does not fit " +
                                        shape_text(ops[0].shape) +
                                        " (the same element type and extents elsewhere)");
    }
    for (const auto& o : ops)
        out[d] += o.shape[d];
    return {{out, ops[0].type}};
}

XSHARD_DECL layout_choice concat_layouts(const op_attributes& at, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape&) {
    layout l = whole_terms(asked[0]);
    l.dims[concat_dim(at, ops[0].shape.size())] = {};
    return {std::vector<layout>(ops.size(), l), {l}};
}

} // namespace xshard::detail

