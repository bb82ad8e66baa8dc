#pragma once
/// \file
/// 2-D batch normalisation (MindSpore's BatchNorm2d) of NCHW activations: per channel,
/// y = (x - mean) / sqrt(var + eps) * gamma + beta, mean and biased variance over the batch,
/// height and width in training, the running statistics in evaluation (updated in training:
/// running = (1 - momentum) running + momentum batch, the variance unbiased, as PyTorch;
/// MindSpore's `momentum` is 1 - this one).
///
/// Layouts (ops/conv_rule.hpp, `pool2d_rule`): the output keeps the input's; channels may be
/// split (each rank normalises its channels; the input is brought to the weights' channel
/// split), the batch may be split:
/// - `sync` on (synchronised batch norm): the per-channel sums are all-reduced over the
///   batch's axes (two all-reduces of 2 C values forward, one of 2 C backward), so the
///   result equals one rank's on the whole batch;
/// - `sync` off (MindSpore's data-parallel default): each rank normalises with its own
///   images' statistics, no message.
/// Height and width may be split (spatial parallelism): a rank holds a band of each image, so
/// the per-channel sums are always all-reduced over the spatial axes (with the batch's axes
/// in the same all-reduce when synchronised): the statistics are the whole images', as on
/// one rank.
/// gamma and beta are laid out like the channels; their gradients are each rank's terms.
///
/// The running statistics are parameters too, not trainable (MindSpore's `moving_mean` and
/// `moving_variance`, laid out like gamma): the parameter traversal lists them after gamma
/// and beta, so checkpoints saved and loaded with `all_parameters` carry them into any
/// layout or mesh, and `parameter_broadcast` covers them; optimizers and gradient
/// synchronisation, which walk weights, skip them.

#include <xshard/comm/collectives.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/nn/step_profile.hpp>
#include <xshard/ops/conv_rule.hpp>
#include <xshard/ops/normalize.hpp>

#include <cmath>
#include <span>
#include <vector>

namespace xshard::nn {

/// The 2-D batch normalisation layer: see the file comment.
template <class T, mesh_type Mesh>
class batch_norm2d {
public:
    struct options {
        T eps = T(1e-5);
        T momentum = T(0.1);
        bool sync = false;     ///< all-reduce the statistics over the batch's axes
        std::string axis = ""; ///< the axis splitting the channels ("" for whole)
    };

    batch_norm2d(const Mesh& mesh, std::size_t channels, options o = {})
        : o_(std::move(o))
        , gamma_(constant_weight<T>(mesh, std::array{channels}, make_layout({o_.axis}), T(1)))
        , beta_(constant_weight<T>(mesh, std::array{channels}, make_layout({o_.axis}), T(0)))
        , moving_mean_{"moving_mean",
                       std::move(constant_weight<T>(mesh, std::array{channels},
                                                    make_layout({o_.axis}), T(0))
                                     .value),
                       std::nullopt, false}
        , moving_var_{
              "moving_variance",
              std::move(constant_weight<T>(mesh, std::array{channels}, make_layout({o_.axis}), T(1))
                            .value),
              std::nullopt, false} {}

    /// Training (batch statistics) or evaluation (running statistics).
    void train(bool on) noexcept { training_ = on; }

    /// An input whose channels are split unlike the weights is redistributed to their split
    /// first (its gradient back by the adjoint).
    tensor<T, Mesh, 4> forward(const tensor<T, Mesh, 4>& x_in) {
        const profile_scope timed(step_part::batch_norm);
        const auto r = pool2d_rule(x_in.layout());
        raise_rule_problem(r.problem, "batch_norm2d");
        x_layout_ = x_in.layout();
        auto to = x_in.layout();
        to.dims[1] = gamma_.value.layout().dims[0];
        const auto x = to_channels_(x_in, to);
        const auto& a = x.local();
        const std::size_t n = a.shape()[0], c = a.shape()[1], hw = a.shape()[2] * a.shape()[3];
        const auto& ms = x.mesh().shape();
        const auto spatial_axes = x.layout().split_axes(2, ms) | x.layout().split_axes(3, ms);
        const auto reduce_axes =
            (o_.sync ? x.layout().split_axes(0, ms) : axis_set{}) | spatial_axes;
        const bool reduce = !reduce_axes.empty();
        std::vector<T> mean(c, T(0)), var(c, T(0));
        double count = double(n * hw);
        if (training_) {
            // This rank's means, then its sums of squares about them: two passes (the
            // variance stays exact to rounding, which the one-rank comparison at 1e-9 needs),
            // pooled over the ranks in one all-gather (detail::pooled_moments).
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t k = 0; k < c; ++k)
                    for (std::size_t j = 0; j < hw; ++j)
                        mean[k] += a.data()[(i * c + k) * hw + j];
            if (n * hw > 0)
                for (auto& m : mean)
                    m /= T(n * hw);
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t k = 0; k < c; ++k)
                    for (std::size_t j = 0; j < hw; ++j) {
                        const T d = a.data()[(i * c + k) * hw + j] - mean[k];
                        var[k] += d * d;
                    }
            if (reduce) {
                const profile_scope reducing(step_part::collectives);
                count = xshard::detail::pooled_moments(x.mesh().sub(reduce_axes), double(n * hw),
                                                       std::span(mean), std::span(var));
            } else {
                for (auto& v : var)
                    v /= T(count);
            }
            auto& rm = moving_mean_.value.local();
            auto& rv = moving_var_.value.local();
            for (std::size_t k = 0; k < c; ++k) {
                const T unbiased = count > 1 ? var[k] * T(count / (count - 1)) : var[k];
                rm(k) = (T(1) - o_.momentum) * rm(k) + o_.momentum * mean[k];
                rv(k) = (T(1) - o_.momentum) * rv(k) + o_.momentum * unbiased;
            }
        } else {
            for (std::size_t k = 0; k < c; ++k) {
                mean[k] = moving_mean_.value.local()(k);
                var[k] = moving_var_.value.local()(k);
            }
        }
        count_ = T(count);
        reduce_ = reduce;
        rstd_.assign(c, T(0));
        for (std::size_t k = 0; k < c; ++k)
            rstd_[k] = T(1) / std::sqrt(var[k] + o_.eps);
        xhat_ = a;
        auto y = x;
        const auto& gm = gamma_.value.local();
        const auto& bt = beta_.value.local();
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t k = 0; k < c; ++k)
                for (std::size_t j = 0; j < hw; ++j) {
                    const std::size_t at = (i * c + k) * hw + j;
                    xhat_.data()[at] = (a.data()[at] - mean[k]) * rstd_[k];
                    y.local().data()[at] = xhat_.data()[at] * gm(k) + bt(k);
                }
        reduce_axes_ = reduce_axes;
        return y;
    }

    /// dx = gamma rstd (dy - mean(dy) - xhat mean(dy xhat)) (training; the means over the
    /// batch's axes too when synchronised), dx = gamma rstd dy in evaluation. Linear in dy, so
    /// each rank's term of dy gives its term of dx.
    tensor<T, Mesh, 4> backward(const tensor<T, Mesh, 4>& dy) {
        const profile_scope timed(step_part::batch_norm);
        const auto& d = dy.local();
        const std::size_t n = d.shape()[0], c = d.shape()[1], hw = d.shape()[2] * d.shape()[3];
        std::vector<T> sums(2 * c, T(0)); // sum dy, sum dy xhat
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t k = 0; k < c; ++k)
                for (std::size_t j = 0; j < hw; ++j) {
                    const std::size_t at = (i * c + k) * hw + j;
                    sums[k] += d.data()[at];
                    sums[c + k] += d.data()[at] * xhat_.data()[at];
                }
        // The local sums are this rank's terms of gamma's and beta's gradients.
        const auto& mesh = dy.mesh();
        const auto terms = dual(gamma_.value.layout(), mesh.shape());
        xt::xtensor<T, 1> dg = xt::zeros<T>({c}), db = xt::zeros<T>({c});
        for (std::size_t k = 0; k < c; ++k) {
            dg(k) = sums[c + k];
            db(k) = sums[k];
        }
        accumulate(gamma_, tensor<T, Mesh, 1>(xshard::detail::unchecked, mesh, gamma_.value.shape(),
                                              std::move(dg), terms));
        accumulate(beta_, tensor<T, Mesh, 1>(xshard::detail::unchecked, mesh, beta_.value.shape(),
                                             std::move(db), terms));
        auto dx = dy;
        const auto& gm = gamma_.value.local();
        if (training_ && reduce_) {
            const profile_scope reducing(step_part::collectives);
            allreduce(mesh.sub(reduce_axes_), std::span(sums), reduction::sum);
        }
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t k = 0; k < c; ++k)
                for (std::size_t j = 0; j < hw; ++j) {
                    const std::size_t at = (i * c + k) * hw + j;
                    T v = d.data()[at];
                    if (training_)
                        v -= (sums[k] + xhat_.data()[at] * sums[c + k]) / count_;
                    dx.local().data()[at] = gm(k) * rstd_[k] * v;
                }
        return to_channels_adjoint_.adjoint(std::move(dx), x_layout_);
    }

    friend void visit_parameters(batch_norm2d& l, auto&& visit) {
        visit("gamma", l.gamma_);
        visit("beta", l.beta_);
        visit("moving_mean", l.moving_mean_);
        visit("moving_variance", l.moving_var_);
    }

    /// This rank's channels' running statistics (for evaluation).
    const xt::xtensor<T, 1>& running_mean() const noexcept { return moving_mean_.value.local(); }
    const xt::xtensor<T, 1>& running_var() const noexcept { return moving_var_.value.local(); }

private:
    options o_;
    weight<tensor<T, Mesh, 1>> gamma_, beta_;
    parameter<tensor<T, Mesh, 1>> moving_mean_, moving_var_;
    std::vector<T> rstd_;
    xt::xtensor<T, 4> xhat_;
    T count_ = T(1);
    bool training_ = true, reduce_ = false;
    axis_set reduce_axes_;
    layout x_layout_;
    kept_redistribution<T, Mesh, 4> to_channels_, to_channels_adjoint_;
};

} // namespace xshard::nn
