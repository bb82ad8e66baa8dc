#pragma once
/// \file
/// The definitions of what graph/primitives/reduce.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitives/reduce.hpp>

namespace xshard::detail {

XSHARD_DECL std::vector<bool> reduced_dims(const op_attributes& at, std::size_t r) {
    std::vector<bool> red(r, at.ints.size() <= 1);
    for (std::size_t i = 1; i < at.ints.size(); ++i) {
        auto d = at.ints[i];
        if (d < 0)
            d += std::int64_t(r);
        if (d < 0 || std::size_t(d) >= r)
            throw std::invalid_argument("dimension " + std::to_string(at.ints[i]) +
                                        " is not one of the operand's " + std::to_string(r));
        red[std::size_t(d)] = true;
    }
    return red;
}

XSHARD_DECL value_shape reduced_shape(const value_shape& s, const std::vector<bool>& red,
                                      bool keep) {
    value_shape out;
    for (std::size_t d = 0; d < s.size(); ++d)
        if (!red[d])
            out.push_back(s[d]);
        else if (keep)
            out.push_back(1);
    return out;
}

XSHARD_DECL std::vector<result_spec> infer_reduce(const op_attributes& at,
                                                  std::span<const operand_type> ops) {
    expect_operands(ops, 1, "a reduction");
    expect_floating(ops, 0, "a reduction");
    const auto red = reduced_dims(at, ops[0].shape.size());
    return {{reduced_shape(ops[0].shape, red, keeps_dims(at)), ops[0].type}};
}

XSHARD_DECL broadcast_walk<1> reduce_walk(const node_shards& s) {
    const auto red = reduced_dims(s.node->attributes, s.operands[0].local.size());
    const auto kept = reduced_shape(s.operands[0].local, red, true);
    return broadcast_walk<1>(s.operands[0].local, {&kept});
}

XSHARD_DECL double reduce_count(const node_shards& s) {
    const auto red = reduced_dims(s.node->attributes, s.operands[0].global.size());
    double n = 1;
    for (std::size_t d = 0; d < red.size(); ++d)
        if (red[d])
            n *= double(s.operands[0].global[d]);
    return n;
}

} // namespace xshard::detail

