#pragma once
/// \file
/// Normalisations and the cross-entropy:
///  - softmax, log_softmax along a dimension (attributes ints = {dim}); softmax with ints =
///    {dim, 1} along the last dimension is causal: position j of row i of the last two
///    dimensions is masked (zero) for j > i, as attention's scores;
///  - layer_norm(x, [gamma, beta]) along the last dimension (reals = {eps});
///  - batch_norm(x, [gamma, beta]) over every dimension but 1 (the channels) with the
///    batch's statistics (reals = {eps}): [N, C] or [N, C, H, W];
///  - cross_entropy(logits [B, C], labels [B] integers): each row's -log softmax at its
///    label, [B].
///
/// Sharding: the normalised dimension is whole (softmax, layer norm, the cross-entropy's
/// classes); other dimensions keep their splits. batch_norm keeps every split: of the batch
/// and of the spatial dimensions (its statistics are all-reduced over their axes: the whole
/// batch's, as on one rank) and of the channels (gamma and beta split alike).
/// VJPs are local, but batch_norm's, which all-reduces two sums per channel.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/elementwise.hpp>
#include <xshard/redistribute/geometry.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace xshard::detail {

/// The normalised dimension of a softmax node on rank `r` (negative counts from the end).
XSHARD_DECL std::size_t norm_dim(const op_attributes& at, std::size_t r);

XSHARD_DECL std::vector<result_spec> infer_softmax(const op_attributes& at,
                                                   std::span<const operand_type> ops);

/// Whether a softmax node masks causally.
inline bool causal(const op_attributes& at) { return at.ints.size() > 1 && at.ints[1] != 0; }

XSHARD_DECL layout_choice softmax_layouts(const op_attributes& at,
                                          std::span<const operand_type> ops,
                                          std::vector<layout> asked, const mesh_shape&);

/// outer x n x inner around dimension `d` of a local shape.
struct rows_around {
    std::size_t outer = 1, n = 1, inner = 1;
    rows_around(const value_shape& s, std::size_t d) {
        for (std::size_t i = 0; i < s.size(); ++i)
            (i < d ? outer : i == d ? n : inner) *= s[i];
    }
};

template <class T, bool Log>
void softmax_forward(const forward_args& x) {
    const auto& s = x.shards;
    const rows_around g(s.operands[0].local, norm_dim(s.node->attributes, s.operands[0].rank()));
    const T* a = static_cast<const T*>(x.operands[0]);
    T* y = static_cast<T*>(x.results[0]);
    // Causal: row o is position o % rows of its matrix, and sees positions up to it.
    const std::size_t rows =
        s.operands[0].rank() >= 2 ? s.operands[0].local[s.operands[0].rank() - 2] : 1;
    const bool mask = causal(s.node->attributes) && !Log;
    for (std::size_t o = 0; o < g.outer; ++o)
        for (std::size_t i = 0; i < g.inner; ++i) {
            const std::size_t base = o * g.n * g.inner + i;
            const std::size_t seen = mask ? std::min(g.n, o % rows + 1) : g.n;
            if (g.inner == 1) { // a contiguous row: in batches
                const T* row = a + base;
                T* out = y + base;
                const T m = run_max(row, seen);
                const lane<T> lx{row, 1}, lm{&m, 0};
                if constexpr (Log) {
                    const T lse = m + std::log(run_sum<T>(
                                          seen, [](auto v, auto mm) { return xsimd::exp(v - mm); },
                                          lx, lm));
                    map_run<T>(out, seen, false, [](auto v, auto l) { return v - l; }, lx,
                               lane<T>{&lse, 0});
                } else {
                    map_run<T>(out, seen, false, [](auto v, auto mm) { return xsimd::exp(v - mm); },
                               lx, lm);
                    const T inv = T(1) / run_sum<T>(seen, [](auto v) { return v; },
                                                    lane<T>{out, 1});
                    map_run<T>(out, seen, false, [](auto v, auto k) { return v * k; },
                               lane<T>{out, 1}, lane<T>{&inv, 0});
                }
                std::fill(out + seen, out + g.n, T(0));
                continue;
            }
            T m = -std::numeric_limits<T>::infinity();
            for (std::size_t j = 0; j < seen; ++j)
                m = std::max(m, a[base + j * g.inner]);
            T sum = 0;
            for (std::size_t j = 0; j < seen; ++j)
                sum += std::exp(a[base + j * g.inner] - m);
            const T log_sum = std::log(sum);
            for (std::size_t j = 0; j < g.n; ++j) {
                const T z = a[base + j * g.inner] - m;
                y[base + j * g.inner] = j >= seen ? T(0) : Log ? z - log_sum : std::exp(z) / sum;
            }
        }
}

/// softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
template <class T, bool Log>
void softmax_vjp(const vjp_args& v) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    const auto& s = v.shards;
    const rows_around g(s.operands[0].local, norm_dim(s.node->attributes, s.operands[0].rank()));
    const T* y = static_cast<const T*>(v.results[0]);
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    const bool add = v.accumulate[0];
    if (!dy) {
        if (!add)
            std::fill_n(dx, s.operands[0].count(), T(0));
        return;
    }
    for (std::size_t o = 0; o < g.outer; ++o)
        for (std::size_t i = 0; i < g.inner; ++i) {
            const std::size_t base = o * g.n * g.inner + i;
            if (g.inner == 1) { // a contiguous row: in batches
                const lane<T> ly{y + base, 1}, ld{dy + base, 1};
                if constexpr (Log) {
                    const T dot = run_sum<T>(g.n, [](auto d) { return d; }, ld);
                    map_run<T>(dx + base, g.n, add,
                               [](auto d, auto yy, auto k) { return d - xsimd::exp(yy) * k; }, ld,
                               ly, lane<T>{&dot, 0});
                } else {
                    const T dot = run_sum<T>(g.n, [](auto d, auto yy) { return d * yy; }, ld, ly);
                    map_run<T>(dx + base, g.n, add,
                               [](auto d, auto yy, auto k) { return yy * (d - k); }, ld, ly,
                               lane<T>{&dot, 0});
                }
                continue;
            }
            T dot = 0;
            for (std::size_t j = 0; j < g.n; ++j)
                dot += dy[base + j * g.inner] * (Log ? T(1) : y[base + j * g.inner]);
            for (std::size_t j = 0; j < g.n; ++j) {
                const std::size_t k = base + j * g.inner;
                const T d = Log ? dy[k] - std::exp(y[k]) * dot : y[k] * (dy[k] - dot);
                dx[k] = add ? dx[k] + d : d;
            }
        }
}

inline double per_element_flops(const op_attributes&, std::span<const shard_type> ops,
                                std::span<const shard_type>) {
    return 5.0 * double(ops[0].count());
}

// An exp per element forward; log_softmax's backward pass another.
inline constexpr op_rules softmax_rules{.name = "softmax",
                                        .infer = infer_softmax,
                                        .rule = softmax_layouts,
                                        .batched = first_batched,
                                        .resolve = resolve_each,
                                        .flops = per_element_flops,
                                        .transcendentals = 1,
                                        .saves = saves_result(0)};
inline constexpr op_rules log_softmax_rules{.name = "log_softmax",
                                            .infer = infer_softmax,
                                            .rule = softmax_layouts,
                                            .batched = first_batched,
                                            .resolve = resolve_each,
                                            .flops = per_element_flops,
                                            .transcendentals = 1,
                                            .backward_transcendentals = 1,
                                            .saves = saves_result(0)};

// Layer norm.

XSHARD_DECL std::vector<result_spec> infer_norm(const op_attributes&,
                                                std::span<const operand_type> ops,
                                                std::size_t channel_dim, std::string_view what);

inline std::vector<result_spec> infer_layer_norm(const op_attributes& at,
                                                 std::span<const operand_type> ops) {
    return infer_norm(at, ops, ops.empty() ? 0 : ops[0].shape.size() - 1, "layer_norm");
}

XSHARD_DECL layout_choice layer_norm_layouts(const op_attributes&,
                                             std::span<const operand_type> ops,
                                             std::vector<layout> asked, const mesh_shape&);

template <class T>
T norm_eps(const node_shards& s) {
    return T(s.node->attributes.reals.empty() ? 1e-5 : s.node->attributes.reals[0]);
}

/// The mean and 1 / sqrt(var + eps) of a row of n values.
template <class T>
std::pair<T, T> row_moments(const T* row, std::size_t n, T eps) {
    const T mean = run_sum<T>(n, [](auto v) { return v; }, lane<T>{row, 1}) / T(n);
    const T var = run_sum<T>(
        n, [](auto v, auto m) { return (v - m) * (v - m); }, lane<T>{row, 1},
        lane<T>{&mean, 0});
    return {mean, T(1) / std::sqrt(var / T(n) + eps)};
}

template <class T>
void layer_norm_forward(const forward_args& x) {
    const auto& s = x.shards;
    const std::size_t n = s.operands[0].local.back(), rows = n ? s.operands[0].count() / n : 0;
    const T* a = static_cast<const T*>(x.operands[0]);
    const T* gamma = x.operands.size() > 1 ? static_cast<const T*>(x.operands[1]) : nullptr;
    const T* beta = x.operands.size() > 2 ? static_cast<const T*>(x.operands[2]) : nullptr;
    T* y = static_cast<T*>(x.results[0]);
    const T eps = norm_eps<T>(s);
    for (std::size_t r = 0; r < rows; ++r) {
        const T* row = a + r * n;
        const auto [mean, inv] = row_moments(row, n, eps);
        const lane<T> lx{row, 1}, lm{&mean, 0}, li{&inv, 0};
        if (gamma)
            map_run<T>(
                y + r * n, n, false,
                [](auto v, auto m, auto k, auto ga, auto be) { return (v - m) * k * ga + be; }, lx,
                lm, li, lane<T>{gamma, 1}, lane<T>{beta, 1});
        else
            map_run<T>(y + r * n, n, false, [](auto v, auto m, auto k) { return (v - m) * k; },
                       lx, lm, li);
    }
}

/// dx = inv (g - mean(g) - h mean(g h)) with g = dy gamma; dgamma = sum dy h, dbeta = sum dy.
template <class T>
void layer_norm_vjp(const vjp_args& v) {
    const auto& s = v.shards;
    const std::size_t n = s.operands[0].local.back(), rows = n ? s.operands[0].count() / n : 0;
    const T* a = static_cast<const T*>(v.operands[0]);
    const bool affine = v.operands.size() > 1;
    const T* gamma = affine ? static_cast<const T*>(v.operands[1]) : nullptr;
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    T* dgamma = affine ? static_cast<T*>(v.operand_cotangents[1]) : nullptr;
    T* dbeta = affine ? static_cast<T*>(v.operand_cotangents[2]) : nullptr;
    if (dgamma && !v.accumulate[1])
        std::fill_n(dgamma, n, T(0));
    if (dbeta && !v.accumulate[2])
        std::fill_n(dbeta, n, T(0));
    if (!dy) {
        if (dx && !v.accumulate[0])
            std::fill_n(dx, s.operands[0].count(), T(0));
        return;
    }
    const T eps = norm_eps<T>(s);
    // Without gamma, g is dy: a lane of ones stands for gamma.
    const T one = T(1);
    const lane<T> lg = gamma ? lane<T>{gamma, 1} : lane<T>{&one, 0};
    for (std::size_t r = 0; r < rows; ++r) {
        const T* row = a + r * n;
        const auto [mean, inv] = row_moments(row, n, eps);
        const lane<T> lx{row, 1}, ld{dy + r * n, 1}, lm{&mean, 0}, li{&inv, 0};
        const auto h = [](auto v, auto m, auto k) { return (v - m) * k; };
        if (dgamma)
            map_run<T>(
                dgamma, n, true, [h](auto d, auto v, auto m, auto k) { return d * h(v, m, k); },
                ld, lx, lm, li);
        if (dbeta)
            map_run<T>(dbeta, n, true, [](auto d) { return d; }, ld);
        if (!dx)
            continue;
        const T mg = run_sum<T>(n, [](auto d, auto ga) { return d * ga; }, ld, lg) / T(n);
        const T mgh = run_sum<T>(
                          n,
                          [h](auto d, auto ga, auto v, auto m, auto k) {
                              return d * ga * h(v, m, k);
                          },
                          ld, lg, lx, lm, li) /
                      T(n);
        map_run<T>(
            dx + r * n, n, v.accumulate[0],
            [h](auto d, auto ga, auto v, auto m, auto k, auto a1, auto a2) {
                return k * (d * ga - a1 - h(v, m, k) * a2);
            },
            ld, lg, lx, lm, li, lane<T>{&mg, 0}, lane<T>{&mgh, 0});
    }
}

inline constexpr op_rules layer_norm_rules{.name = "layer_norm",
                                           .infer = infer_layer_norm,
                                           .rule = layer_norm_layouts,
                                           .batched = first_batched,
                                           .resolve = resolve_each,
                                           .flops = per_element_flops,
                                           .saves = saves_operand(0) | saves_operand(1)};

// Batch norm.

inline std::vector<result_spec> infer_batch_norm(const op_attributes& at,
                                                 std::span<const operand_type> ops) {
    return infer_norm(at, ops, 1, "batch_norm");
}

XSHARD_DECL layout_choice batch_norm_layouts(const op_attributes&,
                                             std::span<const operand_type> ops,
                                             std::vector<layout> asked, const mesh_shape&);

/// Per channel of this rank's block: the count of values, then the batch's sums of `f` over
/// the ranks splitting the batch (one all-reduce of C values each).
struct channel_geometry {
    std::size_t n = 0, c = 0, hw = 1;
    explicit channel_geometry(const value_shape& s)
        : n(s[0])
        , c(s[1]) {
        for (std::size_t d = 2; d < s.size(); ++d)
            hw *= s[d];
    }
};

/// Runs of hw elements shorter than this are taken image by image: a call per run then
/// costs more than its arithmetic (a [N, 512, 1, 1] batch norm is a call per element).
inline constexpr std::size_t short_channel_run = 32;

/// Calls run(e, n, coefficients...) so that its calls cover this rank's block once, element
/// e to e + n, with each of the per-channel vectors `coefs` as a lane of n values: per run of
/// hw elements (a channel of an image) with the channel's values broadcast, or, for runs
/// shorter than short_channel_run, per image (c hw elements) with the vectors expanded to
/// one value per element, once.
template <class T, class Run, class... V>
void channel_runs(const channel_geometry& g, const Run& run, const V&... coefs) {
    if (g.hw >= short_channel_run) {
        for (std::size_t i = 0; i < g.n; ++i)
            for (std::size_t ch = 0; ch < g.c; ++ch)
                run((i * g.c + ch) * g.hw, g.hw, lane<T>{&coefs[ch], 0}...);
        return;
    }
    [[maybe_unused]] const auto expand = [&g](std::span<const T> v) {
        std::vector<T> e(g.c * g.hw);
        for (std::size_t ch = 0; ch < g.c; ++ch)
            std::fill_n(e.begin() + std::ptrdiff_t(ch * g.hw), g.hw, v[ch]);
        return e;
    };
    const std::tuple expanded{expand(coefs)...};
    for (std::size_t i = 0; i < g.n; ++i)
        std::apply(
            [&](const auto&... e) {
                run(i * g.c * g.hw, g.c * g.hw, lane<T>{e.data(), 1}...);
            },
            expanded);
}

/// The sums over this rank's block, per channel, of f(data..., coefficients...) (map_run's
/// `f`): `data(e)` gives the lanes of the elements from e on, `coefs` are per-channel vectors
/// (channel_runs). Short runs add into one sum per element of an image, then per channel.
template <class T, class F, class Data, class... V>
std::vector<T> local_channel_sums(const channel_geometry& g, const F& f, const Data& data,
                                  const V&... coefs) {
    std::vector<T> sums(g.c, T(0));
    if (g.hw >= short_channel_run) {
        channel_runs<T>(
            g,
            [&](std::size_t e, std::size_t n, const auto&... k) {
                sums[(e / g.hw) % g.c] += std::apply(
                    [&](const auto&... d) { return run_sum<T>(n, f, d..., k...); }, data(e));
            },
            coefs...);
        return sums;
    }
    std::vector<T> each(g.c * g.hw, T(0));
    channel_runs<T>(
        g,
        [&](std::size_t e, std::size_t n, const auto&... k) {
            std::apply([&](const auto&... d) { map_run<T>(each.data(), n, true, f, d..., k...); },
                       data(e));
        },
        coefs...);
    for (std::size_t ch = 0; ch < g.c; ++ch)
        for (std::size_t k = 0; k < g.hw; ++k)
            sums[ch] += each[ch * g.hw + k];
    return sums;
}

/// The mesh axes that split x's batch or its dimensions after the channels (height and
/// width): those its statistics are summed over.
XSHARD_DECL axis_set statistics_axes(const shard_type& x, const mesh_shape& mesh);

/// `sums` summed over the ranks of `statistics_axes`: the whole batch's (one all-reduce).
template <class T>
void batch_total(const node_shards& s, std::vector<T>& sums) {
    const axis_set axes = statistics_axes(s.operands[0], s.mesh->shape);
    if (!axes.empty() && !sums.empty())
        allreduce(s.mesh->group(axes), std::span(sums), reduction::sum);
}

/// Seconds of a batch norm node's all-reduces in a training step (`op_rules::kernel_seconds`):
/// the mean and the variance forward (c values each), the two sums backward (2c values).
XSHARD_DECL double batch_norm_seconds(const op_attributes&, std::span<const shard_type> ops,
                                      std::span<const shard_type>, const mesh_shape& mesh,
                                      const cost_model& model);

/// How many values each channel's statistics are over: the whole batch's.
XSHARD_DECL double statistics_count(const node_shards& s);

/// The mean and 1 / sqrt(var + eps) per channel of the whole batch (two passes: the mean,
/// then the squared deviations from it).
template <class T>
std::pair<std::vector<T>, std::vector<T>> batch_moments(const node_shards& s, const T* a) {
    const channel_geometry g(s.operands[0].local);
    const double count = statistics_count(s);
    const auto from = [a](std::size_t e) {
        return std::tuple{lane<T>{a + e, 1}};
    };
    auto mean = local_channel_sums<T>(
        g, [](auto x) { return x; }, from);
    batch_total(s, mean);
    for (auto& m : mean)
        m = T(double(m) / count);
    auto var = local_channel_sums<T>(
        g, [](auto x, auto m) { return (x - m) * (x - m); }, from, mean);
    batch_total(s, var);
    const T eps = norm_eps<T>(s);
    for (auto& v : var)
        v = T(1) / std::sqrt(T(double(v) / count) + eps);
    return {std::move(mean), std::move(var)};
}

/// y = x scale + shift per channel, over this rank's block.
template <class T>
void channel_affine(const channel_geometry& g, const T* x, T* y, const std::vector<T>& scale,
                    const std::vector<T>& shift) {
    channel_runs<T>(
        g,
        [&](std::size_t e, std::size_t n, const auto& a, const auto& b) {
            map_run<T>(
                y + e, n, false, [](auto v, auto k, auto m) { return v * k + m; },
                lane<T>{x + e, 1}, a, b);
        },
        scale, shift);
}

/// A batch-norm node keeps the forward pass's mean and 1 / sqrt(var + eps) per channel in its
/// scratch (2 c values of T) for the backward pass, which then neither streams x for them
/// again nor all-reduces them again.
template <class T>
std::size_t batch_norm_scratch(const node_shards& s) {
    return 2 * channel_geometry(s.operands[0].local).c * sizeof(T);
}

template <class T>
T* batch_statistics(const node_shards& s) {
    return reinterpret_cast<T*>(s.scratch.data());
}

template <class T>
void batch_norm_forward(const forward_args& x) {
    const auto& s = x.shards;
    const channel_geometry g(s.operands[0].local);
    const T* a = static_cast<const T*>(x.operands[0]);
    const T* gamma = x.operands.size() > 1 ? static_cast<const T*>(x.operands[1]) : nullptr;
    const T* beta = x.operands.size() > 2 ? static_cast<const T*>(x.operands[2]) : nullptr;
    auto [scale, shift] = batch_moments<T>(s, a);
    std::copy(scale.begin(), scale.end(), batch_statistics<T>(s));
    std::copy(shift.begin(), shift.end(), batch_statistics<T>(s) + g.c);
    // (a - mean) inv gamma + beta = a scale + shift
    for (std::size_t ch = 0; ch < g.c; ++ch) {
        const T mean = scale[ch], k = gamma ? shift[ch] * gamma[ch] : shift[ch];
        scale[ch] = k;
        shift[ch] = (beta ? beta[ch] : T(0)) - mean * k;
    }
    channel_affine(g, a, static_cast<T*>(x.results[0]), scale, shift);
}

/// With h = (x - mean) inv and g = dy gamma: dx = inv (g - mean(g) - h mean(g h)) per channel
/// over the whole batch, dgamma = sum dy h and dbeta = sum dy over this rank's block (its
/// terms). One pass sums dy and dy (x - mean) per channel, one writes dx.
template <class T>
void batch_norm_vjp(const vjp_args& v) {
    const auto& s = v.shards;
    const channel_geometry g(s.operands[0].local);
    const T* a = static_cast<const T*>(v.operands[0]);
    const bool affine = v.operands.size() > 1;
    const T* gamma = affine ? static_cast<const T*>(v.operands[1]) : nullptr;
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    T* dgamma = affine ? static_cast<T*>(v.operand_cotangents[1]) : nullptr;
    T* dbeta = affine ? static_cast<T*>(v.operand_cotangents[2]) : nullptr;
    if (dgamma && !v.accumulate[1])
        std::fill_n(dgamma, g.c, T(0));
    if (dbeta && !v.accumulate[2])
        std::fill_n(dbeta, g.c, T(0));
    if (!dy && !dx)
        return;
    // The forward pass's statistics (batch_norm_scratch).
    const T* kept = batch_statistics<T>(s);
    const std::span<const T> mean(kept, g.c), inv(kept + g.c, g.c);
    // Per channel of this rank's block: sum dy, then sum dy (x - mean); zero without dy.
    std::vector<T> sums(2 * g.c, T(0));
    if (dy) {
        const auto dys = local_channel_sums<T>(
            g, [](auto d) { return d; },
            [dy](std::size_t e) {
                return std::tuple{lane<T>{dy + e, 1}};
            });
        const auto dyc = local_channel_sums<T>(
            g, [](auto d, auto x, auto m) { return d * (x - m); },
            [dy, a](std::size_t e) {
                return std::tuple{lane<T>{dy + e, 1}, lane<T>{a + e, 1}};
            },
            mean);
        for (std::size_t ch = 0; ch < g.c; ++ch) {
            sums[ch] = dys[ch];
            sums[g.c + ch] = dyc[ch] * inv[ch]; // sum dy h
            if (dgamma)
                dgamma[ch] += sums[g.c + ch];
            if (dbeta)
                dbeta[ch] += dys[ch];
        }
    }
    if (!dx)
        return;
    batch_total(s, sums); // the whole batch's sum g and sum g h, over gamma
    const double count = statistics_count(s);
    // dx = dy k + x b + c per channel: k = inv gamma, b = -inv gamma mean(dy h) inv, and
    // c = -inv gamma mean(dy) - mean b.
    std::vector<T> k(g.c), b(g.c), c(g.c);
    for (std::size_t ch = 0; ch < g.c; ++ch) {
        const T ig = gamma ? inv[ch] * gamma[ch] : inv[ch];
        k[ch] = ig;
        b[ch] = -ig * T(double(sums[g.c + ch]) / count) * inv[ch];
        c[ch] = -ig * T(double(sums[ch]) / count) - mean[ch] * b[ch];
    }
    if (!dy) {
        if (!v.accumulate[0])
            std::fill_n(dx, g.n * g.c * g.hw, T(0));
        return;
    }
    channel_runs<T>(
        g,
        [&](std::size_t e, std::size_t n, const auto& kk, const auto& bb, const auto& cc) {
            map_run<T>(
                dx + e, n, v.accumulate[0],
                [](auto d, auto x, auto k1, auto b1, auto c1) { return d * k1 + x * b1 + c1; },
                lane<T>{dy + e, 1}, lane<T>{a + e, 1}, kk, bb, cc);
        },
        k, b, c);
}

inline constexpr op_rules batch_norm_rules{.name = "batch_norm",
                                           .infer = infer_batch_norm,
                                           .rule = batch_norm_layouts,
                                           .batched = first_batched,
                                           .resolve = resolve_each,
                                           .flops = per_element_flops,
                                           // forward: the mean and the deviations (x
                                           // alone), y; backward: two sums, dx (the
                                           // statistics kept)
                                           .passes = 2,
                                           .backward_passes = 3,
                                           .kernel_seconds = batch_norm_seconds,
                                           .saves = saves_operand(0) | saves_operand(1)};

// Cross-entropy.

XSHARD_DECL std::vector<result_spec> infer_cross_entropy(const op_attributes&,
                                                         std::span<const operand_type> ops);

XSHARD_DECL layout_choice cross_entropy_layouts(const op_attributes&, std::span<const operand_type>,
                                                std::vector<layout> asked, const mesh_shape&);

inline bool both_batched(const op_attributes&, std::span<const operand_type> ops, std::size_t i) {
    return !ops[i].is_weight;
}

/// sum exp(row[j] - max) over a row of n values.
template <class T>
T exp_sum(const T* row, std::size_t n) {
    const T m = run_max(row, n);
    return run_sum<T>(
        n, [](auto v, auto mm) { return xsimd::exp(v - mm); }, lane<T>{row, 1}, lane<T>{&m, 0});
}

template <class T>
void cross_entropy_forward(const forward_args& x) {
    const auto& s = x.shards;
    const std::size_t rows = s.operands[0].local[0], c = s.operands[0].local[1];
    const T* a = static_cast<const T*>(x.operands[0]);
    const auto* labels = static_cast<const std::int64_t*>(x.operands[1]);
    T* y = static_cast<T*>(x.results[0]);
    std::optional<std::string> bad;
    for (std::size_t r = 0; r < rows; ++r)
        if (labels[r] < 0 || std::size_t(labels[r]) >= c)
            bad = "xshard: " + s.node->name + " (cross_entropy): label " +
                  std::to_string(labels[r]) + " is not one of the " + std::to_string(c) +
                  " classes";
    agree_on_error(s.mesh->group(s.mesh->shape.all_axes()), bad);
    for (std::size_t r = 0; r < rows; ++r) {
        const T* row = a + r * c;
        y[r] = std::log(exp_sum(row, c)) + run_max(row, c) - row[labels[r]];
    }
}

/// dlogits = dy (softmax - onehot(label)).
template <class T>
void cross_entropy_vjp(const vjp_args& v) {
    T* dx = static_cast<T*>(v.operand_cotangents[0]);
    if (!dx)
        return;
    const auto& s = v.shards;
    const std::size_t rows = s.operands[0].local[0], c = s.operands[0].local[1];
    const T* a = static_cast<const T*>(v.operands[0]);
    const auto* labels = static_cast<const std::int64_t*>(v.operands[1]);
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    const bool add = v.accumulate[0];
    if (!dy) {
        if (!add)
            std::fill_n(dx, rows * c, T(0));
        return;
    }
    for (std::size_t r = 0; r < rows; ++r) {
        const T* row = a + r * c;
        const T m = run_max(row, c), k = dy[r] / exp_sum(row, c);
        map_run<T>(
            dx + r * c, c, add, [](auto v, auto mm, auto kk) { return kk * xsimd::exp(v - mm); },
            lane<T>{row, 1}, lane<T>{&m, 0}, lane<T>{&k, 0});
        dx[r * c + std::size_t(labels[r])] -= dy[r];
    }
}

inline constexpr op_rules cross_entropy_rules{.name = "cross_entropy",
                                              .infer = infer_cross_entropy,
                                              .rule = cross_entropy_layouts,
                                              .batched = both_batched,
                                              .resolve = resolve_each,
                                              .flops = per_element_flops,
                                              // an exp per logit each way
                                              .transcendentals = 1,
                                              .backward_transcendentals = 1,
                                              .saves = saves_operand(0) | saves_operand(1)};

template <class T>
void register_normalize(auto&& add) {
    add(primitive<T>{&softmax_rules, softmax_forward<T, false>, softmax_vjp<T, false>});
    add(primitive<T>{&log_softmax_rules, softmax_forward<T, true>, softmax_vjp<T, true>});
    add(primitive<T>{&layer_norm_rules, layer_norm_forward<T>, layer_norm_vjp<T>});
    add(primitive<T>{&batch_norm_rules, batch_norm_forward<T>, batch_norm_vjp<T>,
                     batch_norm_scratch<T>});
    add(primitive<T>{&cross_entropy_rules, cross_entropy_forward<T>, cross_entropy_vjp<T>});
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitives/normalize.ipp>
#endif
