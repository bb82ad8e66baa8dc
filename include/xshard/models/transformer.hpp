#pragma once
/// \file
/// A pre-norm transformer block written as a traced function (graph/trace.hpp): no hand-
/// written backward, the same computation as nn::transformer_block with the same weight names
/// ("norm1.gamma", "attention.qkv.weight", "mlp.up.bias", ...), so the weights of one load
/// into the other.
///
///     auto y = xshard::models::transformer_block(x, {.features = 512, .heads = 8,
///                                                    .sequence = 64, .tensor_axis = "tp"});
///
/// x is [tokens, features], the tokens whole sequences of `sequence` positions. Attention:
/// the QKV projection's columns grouped by head (q, k, v of head 0, then head 1, ...), scores
/// q k^T / sqrt(head) masked causally, softmax, times v, the output projection. MLP: up
/// (4 x features by default), exact GELU, down. With a `tensor_axis`, the operations carry
/// Megatron's strategies as MindSpore users write them: the QKV and up projections split by
/// columns over the axis (the heads follow), the output and down projections by rows (a
/// pending sum, all-reduced before the bias), the rows over the `data_axis` when given.

#include <xshard/core/annotation.hpp>
#include <xshard/graph/trace.hpp>
#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/normalize.hpp>
#include <xshard/ops/shape.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <string>

namespace xshard::models {

/// The shape of a transformer block and how it is split.
struct transformer_options {
    std::size_t features = 0;
    std::size_t heads = 1;
    std::size_t sequence = 1; ///< positions per sequence
    std::size_t hidden = 0;   ///< of the MLP; 4 x features if 0
    /// The mesh axis heads and MLP columns are split over ("": none, data parallel).
    std::string tensor_axis = "";
    /// The mesh axis the tokens are split over with a tensor axis ("": not split).
    std::string data_axis = "";
};

namespace detail {

/// "[a, b]" from axis names ("" for a whole dimension).
inline layout dims_layout(std::initializer_list<std::string> dims) {
    std::string text = "[";
    for (const auto& d : dims)
        text += (text.size() > 1 ? ", " : "") + (d.empty() ? std::string("-") : d);
    text += "]";
    return layout(text.c_str());
}

/// x W + b, with W [in, out] and b [out] named `name`.weight and `name`.bias; split by
/// columns (`column`) or rows (`row`) over the tensor axis when there is one.
inline traced_tensor linear(const traced_tensor& x, const std::string& name, std::size_t in,
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

inline traced_tensor norm(const traced_tensor& x, const std::string& name, std::size_t features) {
    return ops::layer_norm(x, param(name + ".gamma", {features}, initializer::constant(1)),
                           param(name + ".beta", {features}, initializer::zeros()));
}

} // namespace detail

/// Causal multi-head self-attention of x [tokens, features] (see the file comment).
inline traced_tensor self_attention(const traced_tensor& x, const transformer_options& o) {
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

/// The pre-norm block: x + attention(norm1(x)), then h + mlp(norm2(h)).
inline traced_tensor transformer_block(const traced_tensor& x, const transformer_options& o) {
    const std::size_t f = o.features, hidden = o.hidden ? o.hidden : 4 * f;
    auto h = ops::add(x, self_attention(detail::norm(x, "norm1", f), o));
    auto up = detail::linear(detail::norm(h, "norm2", f), "mlp.up", f, hidden, o, true);
    auto act = o.tensor_axis.empty()
                   ? ops::gelu(up)
                   : ops::gelu.shard({detail::dims_layout({o.data_axis, o.tensor_axis})})(up);
    return ops::add(h, detail::linear(act, "mlp.down", hidden, f, o, false));
}

} // namespace xshard::models
