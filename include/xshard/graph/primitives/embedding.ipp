#pragma once
/// \file
/// The definitions of what graph/primitives/embedding.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitives/embedding.hpp>

namespace xshard::detail {

XSHARD_DECL std::vector<result_spec> infer_embedding(const op_attributes&,
                                                     std::span<const operand_type> ops) {
    expect_operands(ops, 2, "embedding");
    if (ops[0].type != dtype::i64)
        throw std::invalid_argument("the ids must be integers (i64), not " +
                                    std::string(to_string(ops[0].type)));
    expect_floating(ops, 1, "embedding");
    if (ops[1].shape.size() != 2)
        throw std::invalid_argument("the table must be [V, H], not " + shape_text(ops[1].shape));
    if (ops[0].shape.empty() || ops[0].shape.size() > 3)
        throw std::invalid_argument("the ids must have 1 to 3 dimensions, not " +
                                    shape_text(ops[0].shape));
    value_shape out = ops[0].shape;
    out.push_back(ops[1].shape[1]);
    return {{out, ops[1].type}};
}

XSHARD_DECL layout_choice embedding_layouts(const op_attributes&, std::span<const operand_type>,
                                            std::vector<layout> asked, const mesh_shape&) {
    // The rule's only problems here are the axes the table gives up to the ids (the layouts
    // it returns run: the edge moves the table) and pending sums (resolved on the edges).
    const auto r = embedding_rule(whole_terms(asked[0]), whole_terms(asked[1]));
    layout out = r.out;
    out.partial = r.b.dims[0];
    out.op = reduction::sum;
    return {{r.a, r.b}, {out}};
}

} // namespace xshard::detail

