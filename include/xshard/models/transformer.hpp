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

#include <xshard/compiled.hpp>
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
XSHARD_DECL layout dims_layout(std::initializer_list<std::string> dims);

/// x W + b, with W [in, out] and b [out] named `name`.weight and `name`.bias; split by
/// columns (`column`) or rows (`row`) over the tensor axis when there is one.
XSHARD_DECL traced_tensor linear(const traced_tensor& x, const std::string& name, std::size_t in,
                                 std::size_t out, const transformer_options& o, bool column);

inline traced_tensor norm(const traced_tensor& x, const std::string& name, std::size_t features) {
    return ops::layer_norm(x, param(name + ".gamma", {features}, initializer::constant(1)),
                           param(name + ".beta", {features}, initializer::zeros()));
}

} // namespace detail

/// Causal multi-head self-attention of x [tokens, features] (see the file comment).
XSHARD_DECL traced_tensor self_attention(const traced_tensor& x, const transformer_options& o);

/// The pre-norm block: x + attention(norm1(x)), then h + mlp(norm2(h)).
XSHARD_DECL traced_tensor transformer_block(const traced_tensor& x, const transformer_options& o);

} // namespace xshard::models

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/models/transformer.ipp>
#endif
