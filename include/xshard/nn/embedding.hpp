#pragma once
/// \file
/// Vocabulary-parallel embedding and cross-entropy (Megatron's VocabParallelEmbedding and
/// vocab-parallel loss).
///
/// vocab_parallel_embedding: a table [V, H] split by vocabulary over the tensor axis; ids [N]
/// (rows split over the data axis) -> [N, H] (xshard::ops::embedding: each rank looks up its
/// vocabulary block, one all-reduce completes the rows). Backward: the adjoint all-reduce,
/// then each rank adds the rows of its vocabulary block.
///
/// parallel_cross_entropy: the mean over all rows of -log softmax(logits)[label], logits
/// [N, V] with the classes split over the tensor axis (or not) and the rows over the data
/// axis; labels [N] split like the rows. Three all-reduces of one value per row, never the
/// logits; the loss is the same on every rank. Backward: (softmax - one_hot) / N, local.

#include <xshard/nn/module.hpp>
#include <xshard/ops/embedding.hpp>

#include <xtensor/xview.hpp>

#include <optional>
#include <random>

namespace xshard::nn {

template <class T, mesh_type Mesh>
class vocab_parallel_embedding {
public:
    /// Rows drawn from N(0, `scale`^2).
    vocab_parallel_embedding(const Mesh& mesh, std::size_t vocabulary, std::size_t features,
                             unsigned seed, nn::axes axes = {}, T scale = T(0.02))
        : table_(make_weight<T>(mesh, std::array{vocabulary, features},
                                make_layout({axes.tensor, ""}), seed,
                                std::normal_distribution<T>(T(0), scale))) {}

    tensor<T, Mesh> forward(const tensor<std::int64_t, Mesh, 1>& ids) {
        ids_ = ids;
        auto y = xshard::ops::embedding(ids, table_.value);
        z_layout_ = y.layout();
        z_layout_.partial = table_.value.layout().axes(0); // before the all-reduce
        return y;
    }

    /// Adds the gradient rows to the table; the ids have no gradient.
    void backward(const tensor<T, Mesh>& dy) {
        const auto dz = reduce_adjoint_.adjoint(dy, z_layout_);
        xshard::detail::add_embedding_rows(table_.terms().local(), ids_->local(), dz.local(),
                                           table_.value.block());
    }

    friend void visit_parameters(vocab_parallel_embedding& e, auto&& visit) {
        visit("table", e.table_);
    }

private:
    weight<tensor<T, Mesh, 2>> table_;
    std::optional<tensor<std::int64_t, Mesh, 1>> ids_;
    layout z_layout_;
    kept_redistribution<T, Mesh> reduce_adjoint_;
};

template <class T, mesh_type Mesh>
class parallel_cross_entropy {
public:
    /// The mean loss (the same on every rank). Labels whose rows are split otherwise than the
    /// logits' rows are redistributed to the logits' split first (one integer per row). Each
    /// label must lie in [0, classes), and neither tensor may hold a pending sum: otherwise
    /// every rank throws xshard::error (one all-reduce of one int checks the labels).
    T forward(const tensor<T, Mesh>& logits, const tensor<std::int64_t, Mesh, 1>& labels) {
        const auto& l = logits.layout();
        if (l.is_partial() || labels.layout().is_partial())
            throw error("xshard: parallel_cross_entropy: the logits " + l.to_string() +
                        " and the labels " + labels.layout().to_string() +
                        " must have no pending sum");
        if (!(labels.layout().axes(0) == l.axes(0))) {
            layout rows = layout::replicated(1);
            rows.dims[0] = l.axes(0);
            return forward(logits, redistribute<dynamic_layout(1)>(labels, rows));
        }
        const auto& mesh = logits.mesh();
        // Before any rank reads the labels: out of range raises on every rank.
        xshard::detail::check_labels(mesh.comm(), labels.local(), logits.shape()[1],
                                     "parallel_cross_entropy");
        const auto xb = logits.block();
        const auto stats =
            xshard::detail::softmax_rows(mesh, l, logits.local(), labels.local(), xb);
        // Every rank holding a block of rows knows their losses: one of them counts each.
        const auto& ms = mesh.shape();
        T sum = 0;
        if (ms.group_rank(mesh.rank(), ms.all_axes() - l.split_axes(0, ms)) == 0)
            sum = xt::sum(xt::log(stats.sum_exp) + stats.max - stats.target)();
        allreduce(mesh.comm(), std::span(&sum, 1), reduction::sum);
        rows_ = logits.shape()[0];
        logits_ = logits;
        labels_ = labels;
        stats_ = stats;
        return sum / T(rows_);
    }

    /// The gradient of `scale` times the loss with respect to the logits.
    tensor<T, Mesh> backward(T scale = T(1)) const {
        const auto xb = logits_->block();
        auto d = *logits_;
        auto& g = d.local();
        g = xt::exp(logits_->local() - xt::view(stats_->max, xt::all(), xt::newaxis())) /
            xt::view(stats_->sum_exp, xt::all(), xt::newaxis());
        for (std::size_t i = 0; i < xb.extent[0]; ++i) {
            const auto c = std::size_t(labels_->local()(i));
            if (c >= xb.offset[1] && c < xb.offset[1] + xb.extent[1])
                g(i, c - xb.offset[1]) -= T(1);
        }
        g *= scale / T(rows_);
        const auto terms = dual(d.layout(), d.mesh().shape());
        return to_terms_(std::move(d), terms);
    }

private:
    std::size_t rows_ = 0;
    std::optional<tensor<T, Mesh>> logits_;
    std::optional<tensor<std::int64_t, Mesh, 1>> labels_;
    std::optional<xshard::detail::softmax_row_stats<T>> stats_;
    mutable kept_redistribution<T, Mesh> to_terms_; // the gradient's layout (see as_gradient)
};

} // namespace xshard::nn
