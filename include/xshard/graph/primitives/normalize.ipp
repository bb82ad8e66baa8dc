#pragma once
/// \file
/// The definitions of what graph/primitives/normalize.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitives/normalize.hpp>

namespace xshard::detail {

XSHARD_DECL std::size_t norm_dim(const op_attributes& at, std::size_t r) {
    std::int64_t d = at.ints.empty() ? -1 : at.ints[0];
    if (d < 0)
        d += std::int64_t(r);
    if (d < 0 || std::size_t(d) >= r)
        throw std::invalid_argument("the dimension " +
                                    std::to_string(at.ints.empty() ? -1 : at.ints[0]) +
                                    " is not one of the operand's " + std::to_string(r));
    return std::size_t(d);
}

XSHARD_DECL std::vector<result_spec> infer_softmax(const op_attributes& at,
                                                   std::span<const operand_type> ops) {
    expect_operands(ops, 1, "softmax");
    expect_floating(ops, 0, "softmax");
    norm_dim(at, ops[0].shape.size());
    return {{ops[0].shape, ops[0].type}};
}

XSHARD_DECL layout_choice softmax_layouts(const op_attributes& at,
                                          std::span<const operand_type> ops,
                                          std::vector<layout> asked, const mesh_shape&) {
    layout l = whole_terms(asked[0]);
    const std::size_t r = ops[0].shape.size(), d = norm_dim(at, r);
    l.dims[d] = {};
    if (causal(at)) {
        if (d + 1 != r || r < 2)
            throw std::invalid_argument("a causal softmax runs along the last of at least two "
                                        "dimensions");
        l.dims[r - 2] = {};
    }
    return {{l}, {l}};
}

XSHARD_DECL std::vector<result_spec> infer_norm(const op_attributes&,
                                                std::span<const operand_type> ops,
                                                std::size_t channel_dim, std::string_view what) {
    if (ops.size() != 1 && ops.size() != 3)
        throw std::invalid_argument(std::string(what) +
                                    " takes x, or x, gamma and beta, not " +
                                    std::to_string(ops.size()) + " operands");
    for (std::size_t i = 0; i < ops.size(); ++i)
        expect_floating(ops, i, what);
    if (ops[0].shape.size() <= channel_dim)
        throw std::invalid_argument(std::string(what) + " needs an operand of at least " +
                                    std::to_string(channel_dim + 1) + " dimensions, not " +
                                    shape_text(ops[0].shape));
    const std::size_t c = ops[0].shape[channel_dim];
    for (std::size_t i = 1; i < ops.size(); ++i)
        if (ops[i].shape != value_shape{c})
            throw std::invalid_argument(std::string(what) + ": gamma and beta must be (" +
                                        std::to_string(c) + ",), not " +
                                        shape_text(ops[i].shape));
    return {{ops[0].shape, ops[0].type}};
}

XSHARD_DECL layout_choice layer_norm_layouts(const op_attributes&,
                                             std::span<const operand_type> ops,
                                             std::vector<layout> asked, const mesh_shape&) {
    layout l = whole_terms(asked[0]);
    l.dims[l.rank() - 1] = {};
    layout_choice c{{l}, {l}};
    for (std::size_t i = 1; i < ops.size(); ++i)
        c.operands.push_back(layout::replicated(1));
    return c;
}

XSHARD_DECL layout_choice batch_norm_layouts(const op_attributes&,
                                             std::span<const operand_type> ops,
                                             std::vector<layout> asked, const mesh_shape&) {
    const layout l = whole_terms(asked[0]);
    layout_choice c{{l}, {l}};
    for (std::size_t i = 1; i < ops.size(); ++i) {
        layout p = layout::replicated(1);
        p.dims[0] = l.dims[1];
        c.operands.push_back(p);
    }
    return c;
}

XSHARD_DECL axis_set statistics_axes(const shard_type& x, const mesh_shape& mesh) {
    axis_set axes = x.l.split_axes(0, mesh);
    for (std::size_t d = 2; d < x.rank(); ++d)
        axes = axes | x.l.split_axes(d, mesh);
    return axes;
}

XSHARD_DECL double batch_norm_seconds(const op_attributes&, std::span<const shard_type> ops,
                                      std::span<const shard_type>, const mesh_shape& mesh,
                                      const cost_model& model) {
    const auto& x = ops[0];
    const axis_set axes = statistics_axes(x, mesh);
    const auto p = std::size_t(mesh.group_size(axes));
    const std::size_t c = x.local[1] * element_bytes(x.type);
    return 2 * mpi_all_reduce_seconds(model, mesh, axes, p, c) +
           mpi_all_reduce_seconds(model, mesh, axes, p, 2 * c);
}

XSHARD_DECL double statistics_count(const node_shards& s) {
    const auto& global = s.operands[0].global;
    double count = 1;
    for (std::size_t d = 0; d < global.size(); ++d)
        if (d != 1)
            count *= double(global[d]);
    return count;
}

XSHARD_DECL std::vector<result_spec> infer_cross_entropy(const op_attributes&,
                                                         std::span<const operand_type> ops) {
    expect_operands(ops, 2, "cross_entropy");
    expect_floating(ops, 0, "cross_entropy");
    if (ops[1].type != dtype::i64)
        throw std::invalid_argument("the labels must be integers (i64), not " +
                                    std::string(to_string(ops[1].type)));
    if (ops[0].shape.size() != 2 || ops[1].shape.size() != 1 ||
        ops[0].shape[0] != ops[1].shape[0])
        throw std::invalid_argument("logits [B, C] and labels [B] are expected, not " +
                                    shape_text(ops[0].shape) + " and " + shape_text(ops[1].shape));
    return {{{ops[0].shape[0]}, ops[0].type}};
}

XSHARD_DECL layout_choice cross_entropy_layouts(const op_attributes&, std::span<const operand_type>,
                                                std::vector<layout> asked, const mesh_shape&) {
    layout logits = whole_terms(asked[0]);
    logits.dims[1] = {};
    layout rows = layout::replicated(1);
    rows.dims[0] = logits.dims[0];
    return {{logits, rows}, {rows}};
}

} // namespace xshard::detail

