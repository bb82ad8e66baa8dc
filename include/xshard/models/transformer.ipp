#pragma once
/// \file
/// The definitions of what models/transformer.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/models/transformer.hpp>

namespace xshard::models {

namespace detail {

XSHARD_DECL layout dims_layout(std::initializer_list<std::string> dims) {
    std::string text = "[";
    for (const auto& d : dims)
        text += (text.size() > 1 ? ", " : "") + (d.empty() ? std::string("-") : d);
    text += "]";
    return layout(text.c_str());
}

XSHARD_DECL traced_tensor linear(const traced_tensor& x, const std::string& name, std::size_t in,
                                 std::size_t out, const transformer_options& o, bool column) {
    auto w = param(name + ".weight", {in, out});
    auto b = param(name + ".bias", {out}, initializer::zeros());
    if (o.tensor_axis.empty())
        return ops::add(ops::matmul(x, w), b);
    const auto& tp = o.tensor_axis;
    const auto& dp = o.data_axis;
    if (column) {
        auto y = ops::matmul.shard({dims_layout({dp, ""}), dims_layout({"", tp})})(x, w);
        return ops::add.shard({dims_layout({dp, tp}), dims_layout({tp})})(y, b);
    }
    auto y = ops::matmul.shard({dims_layout({dp, tp}), dims_layout({tp, ""})})(x, w);
    return ops::add.shard({dims_layout({dp, ""}), dims_layout({""})})(y, b);
}

} // namespace detail

XSHARD_DECL traced_tensor self_attention(const traced_tensor& x, const transformer_options& o) {
    const std::size_t f = o.features, h = o.heads, d = f / h, s = o.sequence,
                      b = x.shape()[0] / s;
    auto qkv = detail::linear(x, "attention.qkv", f, 3 * f, o, true);
    // [tokens, 3 f] -> [b, s, h, 3 d] -> [b, h, s, 3 d]: the heads' q, k and v (the shape
    // operations keep the rows' and heads' splits).
    auto heads = ops::transpose<0, 2, 1, 3>(ops::reshape(qkv, std::array{b, s, h, 3 * d}));
    auto q = ops::slice(heads, 3, 0, d), k = ops::slice(heads, 3, d, 2 * d),
         v = ops::slice(heads, 3, 2 * d, 3 * d);
    // Per sequence and head: batched over [b, h], split as the heads are.
    op_annotation per_head;
    if (!o.tensor_axis.empty()) {
        const auto l = detail::dims_layout({o.data_axis, o.tensor_axis, "", ""});
        per_head.in_layouts = {l, l};
    }
    op_annotation one_operand = per_head;
    if (!one_operand.in_layouts.empty())
        one_operand.in_layouts.pop_back();
    // q k^T (k read transposed), scaled, causally masked softmax, times v.
    auto scores = trace_call("matmul", op_attributes{{0, 1}, {}}, per_head, q, k);
    scores = trace_call("scale", op_attributes{{}, {1.0 / std::sqrt(double(d))}}, one_operand,
                        scores);
    auto p = trace_call("softmax", op_attributes{{-1, 1}, {}}, one_operand, scores);
    auto attended = trace_call("matmul", op_attributes{}, per_head, p, v); // [b, h, s, d]
    auto rows = ops::reshape(ops::transpose<0, 2, 1, 3>(attended), std::array{b * s, f});
    return detail::linear(rows, "attention.out", f, f, o, false);
}

XSHARD_DECL traced_tensor transformer_block(const traced_tensor& x, const transformer_options& o) {
    const std::size_t f = o.features, hidden = o.hidden ? o.hidden : 4 * f;
    auto h = ops::add(x, self_attention(detail::norm(x, "norm1", f), o));
    auto up = detail::linear(detail::norm(h, "norm2", f), "mlp.up", f, hidden, o, true);
    auto act = o.tensor_axis.empty()
                   ? ops::gelu(up)
                   : ops::gelu.shard({detail::dims_layout({o.data_axis, o.tensor_axis})})(up);
    return ops::add(h, detail::linear(act, "mlp.down", hidden, f, o, false));
}

} // namespace xshard::models

