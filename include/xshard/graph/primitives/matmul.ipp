#pragma once
/// \file
/// The definitions of what graph/primitives/matmul.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/primitives/matmul.hpp>

namespace xshard::detail {

XSHARD_DECL value_shape as_multiplied(value_shape s, bool t) {
    if (t && s.size() >= 2)
        std::swap(s[s.size() - 2], s[s.size() - 1]);
    return s;
}

XSHARD_DECL std::vector<result_spec> infer_matmul(const op_attributes& at,
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

XSHARD_DECL layout_choice matmul_layouts(const op_attributes& at, std::span<const operand_type>,
                                         std::vector<layout> asked, const mesh_shape&) {
    const matmul_flags f(at);
    const auto r = matmul_rule(as_multiplied(whole_terms(asked[0]), f.ta),
                               as_multiplied(whole_terms(asked[1]), f.tb));
    if (r.problem == rule_problem::rank_mismatch)
        throw std::invalid_argument("the operands' ranks do not multiply");
    return {{as_multiplied(r.a, f.ta), as_multiplied(r.b, f.tb)}, {r.out}};
}

XSHARD_DECL std::vector<layout> matmul_resolve(std::span<const strategy> s,
                                               const mesh_shape& mesh) {
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

XSHARD_DECL gemm_dims local_gemm(const node_shards& s, const matmul_flags& f) {
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

XSHARD_DECL double matmul_flops(const op_attributes& at, std::span<const shard_type> ops,
                                std::span<const shard_type>) {
    node_shards s;
    s.operands.assign(ops.begin(), ops.end());
    const auto g = local_gemm(s, matmul_flags(at));
    return 2.0 * double(g.m) * double(g.n) * double(g.k) * double(g.batches);
}

XSHARD_DECL double matmul_gemm_dimension(const op_attributes& at, std::span<const shard_type> ops,
                                         std::span<const shard_type>) {
    node_shards s;
    s.operands.assign(ops.begin(), ops.end());
    const auto g = local_gemm(s, matmul_flags(at));
    return double(std::min({g.m, g.n, g.k}));
}

} // namespace xshard::detail

