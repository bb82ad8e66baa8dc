#pragma once
/// \file
/// The definitions of what graph/primitives/elementwise.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitives/elementwise.hpp>

namespace xshard::detail {

XSHARD_DECL value_shape broadcast_shape(std::span<const operand_type> ops) {
    std::size_t r = 0;
    for (const auto& o : ops)
        r = std::max(r, o.shape.size());
    value_shape out(r, 1);
    for (const auto& o : ops) {
        for (std::size_t i = 0; i < o.shape.size(); ++i) {
            auto& e = out[r - 1 - i];
            const auto x = o.shape[o.shape.size() - 1 - i];
            if (e != x && e != 1 && x != 1) {
                std::string shapes;
                for (const auto& p : ops)
                    shapes += (shapes.empty() ? "" : " and ") + shape_text(p.shape);
                throw std::invalid_argument("shapes " + shapes + " do not broadcast");
            }
            e = std::max(e, x);
        }
    }
    return out;
}

XSHARD_DECL std::vector<result_spec> infer_elementwise(const op_attributes&,
                                                       std::span<const operand_type> ops) {
    for (std::size_t i = 0; i < ops.size(); ++i)
        expect_floating(ops, i, "an elementwise operation");
    return {{broadcast_shape(ops), ops[0].type}};
}

XSHARD_DECL layout_choice broadcast_rule(const op_attributes&, std::span<const operand_type> ops,
                                         std::vector<layout> asked, const mesh_shape&) {
    const auto shape = broadcast_shape(ops);
    const std::size_t r = shape.size();
    layout out = layout::replicated(r);
    dim_axes used;
    for (std::size_t d = 0; d < r; ++d) {
        for (std::size_t i = 0; i < ops.size() && out.dims[d].empty(); ++i) {
            const std::size_t ri = ops[i].shape.size();
            if (d + ri < r || ops[i].shape[d + ri - r] != shape[d])
                continue;
            for (const auto& a : asked[i].dims[d + ri - r])
                if (!used.contains(a))
                    out.dims[d].push_back(a);
            for (const auto& a : out.dims[d])
                used.push_back(a);
        }
    }
    layout_choice c;
    for (std::size_t i = 0; i < ops.size(); ++i) {
        const std::size_t ri = ops[i].shape.size();
        layout l = layout::replicated(ri);
        for (std::size_t k = 0; k < ri; ++k)
            if (ops[i].shape[k] == shape[k + r - ri])
                l.dims[k] = out.dims[k + r - ri];
        c.operands.push_back(l);
    }
    c.results.push_back(out);
    return c;
}

XSHARD_DECL bool broadcast_batched(const op_attributes&, std::span<const operand_type> ops,
                                   std::size_t i) {
    const auto shape = broadcast_shape(ops);
    return !ops[i].is_weight && !ops[i].shape.empty() && ops[i].shape.size() == shape.size() &&
           ops[i].shape[0] == shape[0];
}

XSHARD_DECL std::vector<result_spec> infer_unary(const op_attributes&,
                                                 std::span<const operand_type> ops) {
    expect_operands(ops, 1, "a unary operation");
    expect_floating(ops, 0, "a unary operation");
    return {{ops[0].shape, ops[0].type}};
}

} // namespace xshard::detail

