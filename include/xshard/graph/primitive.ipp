#pragma once
/// \file
/// The definitions of what graph/primitive.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitive.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL void expect_operands(std::span<const operand_type> ops, std::size_t n,
                                 std::string_view what) {
    if (ops.size() != n)
        throw std::invalid_argument(std::string(what) + " takes " + std::to_string(n) +
                                    " operand" + (n == 1 ? "" : "s") + ", not " +
                                    std::to_string(ops.size()));
}

XSHARD_DECL void expect_floating(std::span<const operand_type> ops, std::size_t i,
                                 std::string_view what) {
    if (ops[i].type == dtype::i64)
        throw std::invalid_argument(std::string(what) + ": operand " + std::to_string(i) +
                                    " must be floating, not i64");
}

XSHARD_DECL layout whole_terms(layout l) {
    l.partial.clear();
    l.op = reduction::sum;
    return l;
}

XSHARD_DECL layout cotangent_layout(const layout& l, const mesh_shape& mesh) {
    layout d = dual(l, mesh);
    layout out = d;
    out.partial.clear();
    for (const auto& a : d.partial)
        if (mesh.sizes[mesh.index(a)] > 1)
            out.partial.push_back(a);
    if (out.partial.empty())
        out.op = reduction::sum;
    return out;
}

XSHARD_DECL std::vector<layout> resolve_each(std::span<const strategy> s, const mesh_shape& mesh) {
    std::vector<layout> out;
    for (const auto& one : s)
        out.push_back(resolve(one, mesh));
    return out;
}

} // namespace detail

} // namespace xshard

