#pragma once
/// \file
/// Multi-head self-attention with the heads split over the tensor axis (Megatron's
/// ParallelAttention): the QKV projection is column-parallel (each rank computes the queries,
/// keys and values of its heads), attention runs locally per sequence and head, and the
/// output projection is row-parallel (one all-reduce). Backward: the same in reverse; the only
/// collectives are the adjoints of the two linear layers'.
///
/// Activations are [tokens, features] with tokens = sequences x `sequence` positions, the
/// tokens split over the data axis in whole sequences (the number of sequences a multiple of
/// the data axis' size) and the heads over the tensor axis (`heads` a multiple of its size).
/// The QKV weight's columns are grouped by head (q, k, v of head 0, then of head 1, ...), so
/// that a block of columns holds whole heads. A causal mask hides later positions.
/// `attention_heads` is the local core.

#include <xshard/nn/linear.hpp>

#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xview.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace xshard::nn {

/// Throws xshard::error, on every rank alike (from the global shape and the layout), unless
/// every rank's block of the tokens of `x` [tokens, features] holds whole sequences of
/// `sequence` tokens (core/partition.hpp's blocks: the sequences split evenly over the rows'
/// axes).
template <distributed_tensor X>
void check_whole_sequences(const X& x, std::size_t sequence, std::string_view who) {
    const std::size_t tokens = x.shape()[0],
                      k = std::size_t(x.layout().split_count(0, x.mesh().shape()));
    if (sequence != 1 && tokens % (k * sequence) != 0)
        throw error("xshard: " + std::string(who) + ": " + std::to_string(tokens) +
                    " tokens in sequences of " + std::to_string(sequence) +
                    " do not split into whole sequences over " + std::to_string(k) +
                    " blocks of rows (" + x.layout().to_string() + ")");
}

/// The local core of multi-head attention, on one rank's block of [tokens, 3 x head x heads]
/// (the queries, keys and values of a head side by side, the heads in turn) holding whole
/// sequences of `sequence` tokens: per sequence and head softmax(q k^T / sqrt(head)) v, masked
/// causally if asked, giving [tokens, head x heads]. The probabilities and the input are kept
/// for `backward`, which gives the gradient of the input from the output's.
template <class T>
class attention_heads {
public:
    attention_heads(std::size_t head, std::size_t sequence, bool causal)
        : head_(head)
        , sequence_(sequence)
        , causal_(causal) {}

    /// Throws xshard::error if `qkv` holds no whole sequences or no whole heads.
    xt::xtensor<T, 2> forward(const xt::xtensor<T, 2>& a) {
        const std::size_t rows = a.shape()[0], heads = a.shape()[1] / (3 * head_);
        if (rows % sequence_ != 0 || a.shape()[1] % (3 * head_) != 0)
            throw error("xshard: attention: a block of " + std::to_string(rows) + " x " +
                        std::to_string(a.shape()[1]) + " is not whole sequences of " +
                        std::to_string(sequence_) + " tokens and whole heads of 3 x " +
                        std::to_string(head_) + " columns");
        qkv_ = a;
        probabilities_.assign(rows / sequence_ * heads, {});
        xt::xtensor<T, 2> o = xt::zeros<T>({rows, heads * head_});
        for_each_head(rows, heads, [&](std::size_t h, auto rs, std::size_t k) {
            const xt::xtensor<T, 2> q =
                xt::view(a, rs, xt::range(3 * head_ * h, 3 * head_ * h + head_));
            const xt::xtensor<T, 2> kk =
                xt::view(a, rs, xt::range(3 * head_ * h + head_, 3 * head_ * h + 2 * head_));
            const xt::xtensor<T, 2> v =
                xt::view(a, rs, xt::range(3 * head_ * h + 2 * head_, 3 * head_ * (h + 1)));
            xt::xtensor<T, 2> p = xt::linalg::dot(q, xt::transpose(kk)) / std::sqrt(T(head_));
            softmax_rows(p);
            xt::view(o, rs, xt::range(head_ * h, head_ * (h + 1))) = xt::linalg::dot(p, v);
            probabilities_[k] = std::move(p);
        });
        return o;
    }

    /// The gradient of the last forward's input from its output's, `g`.
    xt::xtensor<T, 2> backward(const xt::xtensor<T, 2>& g) const {
        const auto& a = qkv_;
        const std::size_t rows = a.shape()[0], heads = a.shape()[1] / (3 * head_);
        xt::xtensor<T, 2> dqkv = xt::zeros<T>(a.shape());
        const T scale = T(1) / std::sqrt(T(head_));
        for_each_head(rows, heads, [&](std::size_t h, auto rs, std::size_t k) {
            auto qr = xt::range(3 * head_ * h, 3 * head_ * h + head_);
            auto kr = xt::range(3 * head_ * h + head_, 3 * head_ * h + 2 * head_);
            auto vr = xt::range(3 * head_ * h + 2 * head_, 3 * head_ * (h + 1));
            const xt::xtensor<T, 2> q = xt::view(a, rs, qr), kk = xt::view(a, rs, kr),
                                    v = xt::view(a, rs, vr);
            const xt::xtensor<T, 2> go = xt::view(g, rs, xt::range(head_ * h, head_ * (h + 1)));
            const auto& p = probabilities_[k];
            const xt::xtensor<T, 2> dp = xt::linalg::dot(go, xt::transpose(v));
            const xt::xtensor<T, 2> row =
                xt::sum(dp * p, {1}, xt::keep_dims); // evaluated first (xtensor 0.24)
            xt::xtensor<T, 2> ds = p * (dp - row);
            ds *= scale;
            xt::view(dqkv, rs, qr) = xt::linalg::dot(ds, kk);
            xt::view(dqkv, rs, kr) = xt::linalg::dot(xt::transpose(ds), q);
            xt::view(dqkv, rs, vr) = xt::linalg::dot(xt::transpose(p), go);
        });
        return dqkv;
    }

private:
    /// Calls f(local head, rows of the sequence, cache index) for every sequence and local head.
    template <class F>
    void for_each_head(std::size_t rows, std::size_t heads, F f) const {
        for (std::size_t s = 0; s < rows / sequence_; ++s)
            for (std::size_t h = 0; h < heads; ++h)
                f(h, xt::range(s * sequence_, (s + 1) * sequence_), s * heads + h);
    }

    /// Softmax of each row of scores, masked causally.
    void softmax_rows(xt::xtensor<T, 2>& p) const {
        const std::size_t n = p.shape()[0];
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t last = causal_ ? i + 1 : n;
            T m = std::numeric_limits<T>::lowest();
            for (std::size_t j = 0; j < last; ++j)
                m = std::max(m, p(i, j));
            T sum = 0;
            for (std::size_t j = 0; j < n; ++j) {
                p(i, j) = j < last ? std::exp(p(i, j) - m) : T(0);
                sum += p(i, j);
            }
            for (std::size_t j = 0; j < last; ++j)
                p(i, j) /= sum;
        }
    }

    std::size_t head_, sequence_;
    bool causal_;
    xt::xtensor<T, 2> qkv_;
    std::vector<xt::xtensor<T, 2>> probabilities_;
};

template <class T, mesh_type Mesh>
class self_attention {
public:
    struct options {
        nn::axes axes = {};
        std::size_t heads = 1;
        std::size_t sequence = 1; ///< positions per sequence
        bool causal = true;
    };

    self_attention(const Mesh& mesh, std::size_t features, unsigned seed, options o)
        : o_(checked(std::move(o), features))
        , heads_(features / o_.heads, o_.sequence, o_.causal)
        , qkv_(mesh, features, 3 * features, seed, {.axes = o_.axes})
        , out_(mesh, features, features, seed + 1, {.axes = o_.axes}) {
        const int tp = o_.axes.tensor.empty() ? 1 : mesh.shape().axis_size(o_.axes.tensor);
        if (o_.heads % std::size_t(tp) != 0)
            throw error("xshard: self_attention: " + std::to_string(o_.heads) +
                        " heads do not split over " + std::to_string(tp) + " ranks of axis " +
                        o_.axes.tensor);
    }

private:
    /// `o` after checking that `features` split into its heads: before anything divides
    /// by the number of heads.
    static options checked(options o, std::size_t features) {
        if (o.heads == 0 || features % o.heads != 0)
            throw error("xshard: self_attention: " + std::to_string(features) +
                        " features do not split into " + std::to_string(o.heads) + " heads");
        if (o.sequence == 0)
            throw error("xshard: self_attention: a sequence of 0 positions");
        return o;
    }

public:
    tensor<T, Mesh> forward(const tensor<T, Mesh>& x) {
        check_whole_sequences(x, o_.sequence, "self_attention");
        const auto qkv = qkv_.forward(x);
        // The heads' outputs, side by side: split like the QKV columns, by heads.
        return out_.forward(tensor<T, Mesh>(xshard::detail::unchecked, x.mesh(), x.shape(),
                                            heads_.forward(qkv.local()), qkv.layout()));
    }

    tensor<T, Mesh> backward(const tensor<T, Mesh>& dy) {
        const auto d_o = out_.backward(dy);
        const std::array<std::size_t, 2> shape{d_o.shape()[0], 3 * d_o.shape()[1]};
        return qkv_.backward(tensor<T, Mesh>(xshard::detail::unchecked, d_o.mesh(), shape,
                                             heads_.backward(d_o.local()), d_o.layout()));
    }

    friend void visit_parameters(self_attention& a, auto&& visit) {
        visit("qkv", a.qkv_);
        visit("out", a.out_);
    }

private:
    options o_;
    attention_heads<T> heads_;
    column_parallel_linear<T, Mesh> qkv_;
    row_parallel_linear<T, Mesh> out_;
};

} // namespace xshard::nn
