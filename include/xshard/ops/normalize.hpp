#pragma once
/// \file
/// Normalisations along a dimension that may be split: softmax, log-softmax, layer norm,
/// batch norm.
///
/// Rule (rules.hpp, `normalization_rule`): the output keeps the input's layout; the input
/// must not be partial. Along a split dimension the per-row statistics are all-reduced over
/// its axes (the max and the sum of exponentials for softmax; the sum and the sum of squared
/// deviations for the norms): vectors of one value per row, never the tensor.

#include <xshard/comm/collectives.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/ops/rules.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

namespace xshard {

namespace detail {

template <std::size_t Dim>
struct normalization_rule_fn {
    constexpr rule_result operator()(const layout& a) const { return normalization_rule(a, Dim); }
};

/// All-reduces `stat` (a statistic per row, `xt::xtensor`) over the axes splitting Dim.
template <class D, class S>
void all_reduce_over(const D& t, const layout& l, std::size_t dim, S& stat, reduction op) {
    const auto axes = l.split_axes(dim, t.mesh().shape());
    if (!axes.empty() && stat.size() > 0)
        allreduce(t.mesh().sub(axes), std::span(stat.data(), stat.size()), op);
}

/// Means and biased variances, per channel, of data split over the ranks of `group`, from
/// each rank's element count (per channel), means and sums of squares about those means:
/// one all-gather, combined in rank order, so that every rank gets the same values (Chan,
/// Golub and LeVeque: M2 = sum_r M2_r + n_r (mean_r - mean)^2; PyTorch's SyncBatchNorm
/// gathers per-rank statistics alike). Reducing the sums and then the sums about the global
/// means takes two collectives; a one-pass sum of squares loses the variance to
/// cancellation. `means` becomes the pooled means and `m2` the variances. Returns the total
/// count.
template <class T>
double pooled_moments(const communicator& group, double count, std::span<T> means,
                      std::span<T> m2) {
    const std::size_t c = means.size(), stride = 2 * c + 1, p = std::size_t(group.size());
    std::vector<double> mine(stride), all(stride * p);
    mine[0] = count;
    for (std::size_t k = 0; k < c; ++k) {
        mine[1 + k] = double(means[k]);
        mine[1 + c + k] = double(m2[k]);
    }
    allgather(group, mine, all);
    double total = 0;
    std::vector<double> mean(c, 0.0), var(c, 0.0);
    for (std::size_t r = 0; r < p; ++r) {
        total += all[r * stride];
        for (std::size_t k = 0; k < c; ++k)
            mean[k] += all[r * stride] * all[r * stride + 1 + k];
    }
    if (total > 0)
        for (auto& m : mean)
            m /= total;
    for (std::size_t r = 0; r < p; ++r) {
        const double n = all[r * stride];
        if (n == 0)
            continue;
        for (std::size_t k = 0; k < c; ++k) {
            const double d = all[r * stride + 1 + k] - mean[k];
            var[k] += all[r * stride + 1 + c + k] + n * d * d;
        }
    }
    for (std::size_t k = 0; k < c; ++k) {
        means[k] = T(mean[k]);
        m2[k] = T(total > 0 ? var[k] / total : 0.0);
    }
    return total;
}

/// xt::sum(e, axes, xt::keep_dims), also for an empty block: zeros then (xtensor's reducer
/// offsets the null data pointer of an empty container, which is undefined behaviour).
template <class T, std::size_t N, class E, class Axes>
xt::xtensor<T, N> sum_kept(const E& e, const Axes& axes) {
    if (e.size() != 0)
        return xt::sum(e, axes, xt::keep_dims);
    auto s = detail::to_array<N>(e.shape());
    for (auto d : axes)
        s[d] = 1;
    return xt::zeros<T>(s);
}

/// Runs `f(local, layout)` on the prepared input of a normalisation along Dim and wraps the
/// result in the input's layout.
template <std::size_t Dim, class A, class F>
auto normalize(const A& a, const char* name, F f) {
    static_assert(Dim < A::rank,
                  "xshard: the normalised dimension is not a dimension of the tensor");
    using rule = rule_for<normalization_rule_fn<Dim>, A>;
    const auto& res = rule::get(name, a);
    const auto pa = prepare(a, res.a, rule::may_redistribute, name);
    xt::xtensor<typename A::value_type, A::rank> local = f(pa.get(), res.a);
    using result = result_t<typename A::value_type, typename A::mesh_type, rule::is_static,
                            rule::value.out, A::rank>;
    return result(unchecked, a.mesh(), a.shape(), std::move(local), res.out);
}

/// The max along Dim (kept as extent 1), all-reduced over Dim's axes.
template <std::size_t Dim, class A, class L>
auto global_max(const A& a, const L& x, const layout& l) {
    using T = typename A::value_type;
    xt::xtensor<T, A::rank> m;
    if (x.shape()[Dim] == 0) {
        auto s = detail::to_array<A::rank>(x.shape());
        s[Dim] = 1;
        m = xt::xtensor<T, A::rank>::from_shape(s);
        m.fill(std::numeric_limits<T>::lowest());
    } else {
        m = xt::amax(x, {Dim}, xt::keep_dims);
    }
    all_reduce_over(a, l, Dim, m, reduction::max);
    return m;
}

} // namespace detail

namespace ops {

/// softmax along Dim: exp(x - max) / sum exp(x - max), with max and sum all-reduced over the
/// axes splitting Dim (2 all-reduces of one value per row).
template <std::size_t Dim, distributed_tensor A>
auto softmax(const A& a) {
    return detail::normalize<Dim>(a, "softmax", [&](const auto& x, const layout& l) {
        auto m = detail::global_max<Dim>(a, x, l);
        xt::xtensor<typename A::value_type, A::rank> e = xt::exp(x - m);
        auto s = detail::sum_kept<typename A::value_type, A::rank>(e, std::array{Dim});
        detail::all_reduce_over(a, l, Dim, s, reduction::sum);
        return xt::xtensor<typename A::value_type, A::rank>(e / s);
    });
}

/// log-softmax along Dim: x - max - log sum exp(x - max) (2 all-reduces of one value per row).
template <std::size_t Dim, distributed_tensor A>
auto log_softmax(const A& a) {
    return detail::normalize<Dim>(a, "log_softmax", [&](const auto& x, const layout& l) {
        auto m = detail::global_max<Dim>(a, x, l);
        auto s = detail::sum_kept<typename A::value_type, A::rank>(xt::exp(x - m), std::array{Dim});
        detail::all_reduce_over(a, l, Dim, s, reduction::sum);
        return xt::xtensor<typename A::value_type, A::rank>(x - m - xt::log(s));
    });
}

/// Layer normalisation along Dim: (x - mean) / sqrt(var + eps), mean and (biased) variance
/// over Dim, each all-reduced over Dim's axes (2 all-reduces of one value per row).
template <std::size_t Dim, distributed_tensor A>
auto layer_norm(const A& a, typename A::value_type eps = typename A::value_type(1e-5)) {
    using T = typename A::value_type;
    return detail::normalize<Dim>(a, "layer_norm", [&](const auto& x, const layout& l) {
        const T n = T(a.shape()[Dim]);
        xt::xtensor<T, A::rank> mu = detail::sum_kept<T, A::rank>(x, std::array{Dim});
        detail::all_reduce_over(a, l, Dim, mu, reduction::sum);
        mu /= n;
        xt::xtensor<T, A::rank> centred = x - mu;
        xt::xtensor<T, A::rank> var =
            detail::sum_kept<T, A::rank>(centred * centred, std::array{Dim});
        detail::all_reduce_over(a, l, Dim, var, reduction::sum);
        var /= n;
        return xt::xtensor<T, A::rank>(centred / xt::sqrt(var + eps));
    });
}

/// Batch normalisation (training statistics) of x [N, C, ...]: every channel normalised
/// over the batch and every dimension after the channel, statistics all-reduced over the
/// axes splitting those dimensions (as MindSpore's BatchNorm with strategy (4, 1): the batch
/// is split, so the per-channel sums are all-reduced over its axis).
template <distributed_tensor A>
auto batch_norm(const A& a, typename A::value_type eps = typename A::value_type(1e-5)) {
    using T = typename A::value_type;
    constexpr std::size_t N = A::rank;
    static_assert(N >= 2, "xshard: batch_norm needs [batch, channels, ...]");
    return detail::normalize<1>(a, "batch_norm", [&](const auto& x, const layout& l) {
        // The statistics are over every dimension but 1.
        std::array<std::size_t, N - 1> over{};
        std::size_t count = 1;
        for (std::size_t d = 0, o = 0; d < N; ++d)
            if (d != 1) {
                over[o++] = d;
                count *= a.shape()[d];
            }
        axis_set axes;
        for (auto d : over)
            axes = axes | l.split_axes(d, a.mesh().shape());
        // This rank's means and sums of squares about them, pooled over the axes
        // splitting the statistics' dimensions in one all-gather (detail::pooled_moments).
        std::size_t local = 1;
        for (auto d : over)
            local *= x.shape()[d];
        xt::xtensor<T, N> mu = detail::sum_kept<T, N>(x, over);
        if (local > 0)
            mu /= T(local);
        xt::xtensor<T, N> var = detail::sum_kept<T, N>(xt::square(x - mu), over);
        if (axes.empty())
            var /= T(count);
        else
            detail::pooled_moments(a.mesh().sub(axes), double(local),
                                   std::span(mu.data(), mu.size()),
                                   std::span(var.data(), var.size()));
        xt::xtensor<T, N> centred = x - mu;
        return xt::xtensor<T, N>(centred / xt::sqrt(var + eps));
    });
}

// On traced tensors (ops/annotated.hpp): the same operations recorded in the program being
// traced. layer_norm normalises the last dimension; layer_norm and batch_norm take optional
// affine weights gamma and beta (one per feature, resp. channel).

template <std::size_t Dim, traced_operand A>
auto softmax(const A& a) {
    return trace_call("softmax", op_attributes{{std::int64_t(Dim)}, {}}, op_annotation{}, a);
}
template <std::size_t Dim, traced_operand A>
auto log_softmax(const A& a) {
    return trace_call("log_softmax", op_attributes{{std::int64_t(Dim)}, {}}, op_annotation{}, a);
}
/// softmax along the last dimension of a traced tensor whose last two dimensions are square
/// score matrices, position j of row i masked for j > i (attention's causal mask).
template <traced_operand A>
auto causal_softmax(const A& a) {
    return trace_call("softmax", op_attributes{{-1, 1}, {}}, op_annotation{}, a);
}
template <traced_operand A>
auto layer_norm(const A& a, double eps = 1e-5) {
    return trace_call("layer_norm", op_attributes{{}, {eps}}, op_annotation{}, a);
}
template <traced_operand A>
auto layer_norm(const A& a, const A& gamma, const A& beta, double eps = 1e-5) {
    return trace_call("layer_norm", op_attributes{{}, {eps}}, op_annotation{}, a, gamma, beta);
}
template <traced_operand A>
auto batch_norm(const A& a, double eps = 1e-5) {
    return trace_call("batch_norm", op_attributes{{}, {eps}}, op_annotation{}, a);
}
template <traced_operand A>
auto batch_norm(const A& a, const A& gamma, const A& beta, double eps = 1e-5) {
    return trace_call("batch_norm", op_attributes{{}, {eps}}, op_annotation{}, a, gamma, beta);
}

} // namespace ops

} // namespace xshard
