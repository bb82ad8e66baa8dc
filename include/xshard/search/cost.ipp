#pragma once
/// \file
/// The definitions of what search/cost.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/cost.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::optional<layout> sharded_layout(const layout& w, const mesh_shape& mesh,
                                                 const std::vector<std::size_t>& shape) {
    axis_set extra;
    for (std::size_t i = 0; i < mesh.names.size(); ++i)
        if (mesh.sizes[i] > 1 && !w.uses(mesh.names[i]))
            extra = extra.with(i);
    if (extra.empty())
        return std::nullopt;
    return xshard::sharded_layout(w, mesh, shape, extra);
}

XSHARD_DECL void price_compute(op_cost& r, const op_spec& op, weight_split w,
                               const std::array<std::size_t, 2>& x,
                               const std::array<std::size_t, 2>& y, std::size_t seq, int tp,
                               const machine_model& m) {
    const double e = double(m.element);
    // Compute: a GEMM's forward 2 r k n, its backward twice that.
    switch (op.kind) {
    case op_kind::linear: {
        const double k = w == weight_split::input ? double(largest_block(op.in, std::size_t(tp)))
                                                  : double(op.in);
        r.compute = m.gemm_seconds(3 * 2 * double(y[0]) * k * double(y[1]),
                                   std::min({double(y[0]), k, double(y[1])}));
        r.activation_memory = std::size_t(x[0] * x[1] * m.element);
        break;
    }
    case op_kind::attention: {
        // Scores q k^T and their use on v: 4 s^2 d per sample and head group, products of
        // [s, d / heads] and [d / heads, s], kept: q, k, v and the scores.
        const double rows = double(y[0]), width = double(y[1]);
        r.compute = m.gemm_seconds(
            3 * 4 * rows * double(seq) * width,
            std::min(double(seq), double(op.out) / double(std::max<std::size_t>(op.heads, 1))));
        const double heads = double(op.heads) * width / double(op.out);
        r.activation_memory = std::size_t(double(x[0] * x[1]) * e + rows * double(seq) * heads * e);
        break;
    }
    default: {
        // Elementwise work: read and write the block, forward and backward.
        const double bytes = double(y[0] * y[1]) * e;
        r.compute = 3 * 2 * bytes / m.memory_bandwidth;
        r.activation_memory =
            op.kind == op_kind::embedding ? 0 : std::size_t(x[0] * x[1]) * m.element;
        break;
    }
    }
}

XSHARD_DECL void price_output_redistribution(op_cost& r, const layout& from, const layout& to,
                                             std::size_t tokens, std::size_t features,
                                             redistribution_pricer& pricer) {
    const auto& mesh = pricer.mesh();
    const auto fwd = pricer(from, to, tokens, features);
    const auto bwd = pricer(dual(to, mesh), dual(from, mesh), tokens, features);
    r.communication = fwd.seconds + bwd.seconds;
    r.comm_bytes = fwd.bytes + bwd.bytes;
}

XSHARD_DECL std::vector<std::pair<layout, std::vector<std::size_t>>>
op_parameters(const op_spec& op, weight_split w) {
    std::vector<std::pair<layout, std::vector<std::size_t>>> params;
    if (op.kind == op_kind::normalization) {
        params.push_back({layout::parse("[-]"), {op.out}});
        params.push_back({layout::parse("[-]"), {op.out}});
    } else if (op.kind == op_kind::linear || op.kind == op_kind::embedding) {
        params.push_back({weight_layout(w), {op.in, op.out}});
        if (op.bias)
            params.push_back({bias_layout(w), {op.out}});
    }
    return params;
}

XSHARD_DECL std::size_t largest_block_elements(const layout& l,
                                               const std::vector<std::size_t>& shape,
                                               const mesh_shape& mesh) {
    std::size_t n = 1;
    for (std::size_t d = 0; d < shape.size(); ++d)
        n *= largest_block(shape[d], std::size_t(l.split_count(d, mesh)));
    return n;
}

XSHARD_DECL redistribution_price gradient_sync_price(const layout& wl,
                                                     const std::optional<layout>& sharded,
                                                     const std::vector<std::size_t>& shape,
                                                     int hsdp_level,
                                                     redistribution_pricer& pricer) {
    const auto price = [&](const layout& a, const layout& b) {
        if (a == b)
            return redistribution_price{};
        const auto of_rank = [&]<std::size_t N>(std::integral_constant<std::size_t, N>) {
            std::array<std::size_t, N> s{};
            std::copy_n(shape.begin(), N, s.begin());
            return pricer.direct_memo(a, b, s);
        };
        switch (shape.size()) {
        case 1:
            return of_rank(std::integral_constant<std::size_t, 1>{});
        case 2:
            return of_rank(std::integral_constant<std::size_t, 2>{});
        case 3:
            return of_rank(std::integral_constant<std::size_t, 3>{});
        case 4:
            return of_rank(std::integral_constant<std::size_t, 4>{});
        default:
            throw error("xshard: the cost model prices weights of 1 to 4 dimensions, not " +
                        std::to_string(shape.size()));
        }
    };
    const auto terms = dual(wl, pricer.mesh());
    if (!sharded)
        return price(terms, wl);
    if (hsdp_level == 1) {
        const auto a = price(terms, wl), b = price(*sharded, wl);
        return {a.seconds + b.seconds, a.bytes + b.bytes};
    }
    const auto a = price(terms, *sharded), b = price(*sharded, wl);
    return {a.seconds + b.seconds, a.bytes + b.bytes};
}

XSHARD_DECL void price_parameter(op_cost& r, const layout& wl,
                                 const std::vector<std::size_t>& shape, int hsdp_level,
                                 const machine_model& m, redistribution_pricer& pricer) {
    const auto& mesh = pricer.mesh();
    const double e = double(m.element);
    const double states = m.optimizer_states;
    std::size_t global = m.element;
    for (std::size_t d = 0; d < shape.size(); ++d)
        global *= shape[d];
    const double bytes = double(largest_block_elements(wl, shape, mesh)) * e;
    std::optional<layout> sharded;
    if (hsdp_level > 0 && global >= m.hsdp_threshold_bytes)
        sharded = detail::sharded_layout(wl, mesh, shape);
    const double shard_bytes =
        sharded ? double(largest_block_elements(*sharded, shape, mesh)) * e : bytes;
    // weight + gradient + optimizer state (+ the sharded master copy's update)
    const double grad = (sharded && hsdp_level >= 2) ? shard_bytes : bytes;
    const double state = states * (sharded ? shard_bytes : bytes);
    r.weight_memory += std::size_t(bytes + grad + state);
    const auto sync = gradient_sync_price(wl, sharded, shape, hsdp_level, pricer);
    // The update of the (sharded) weight and the gradient's zeroing.
    r.synchronization += sync.seconds + m.update_seconds(sharded ? shard_bytes : bytes, grad);
    r.sync_bytes += sync.bytes;
}

} // namespace detail

XSHARD_DECL op_cost cost_of(const op_spec& op, const op_choice& c, std::size_t samples,
                            std::size_t seq, int hsdp_level, const machine_model& m,
                            redistribution_pricer& pricer) {
    op_cost r;
    const auto& mesh = pricer.mesh();
    const int dp = mesh.sizes[0], tp = mesh.sizes[1];
    const auto options = op_options(op, c.in, dp, tp, samples);
    const auto chosen = std::find_if(options.begin(), options.end(),
                                     [&](const auto& o) { return o.first == c.weight; });
    if (chosen == options.end())
        return r;
    r.valid = true;
    const std::size_t tokens = samples * seq;
    const auto& out_layout = chosen->second;
    const auto x = detail::largest_activation_block(activation_layout(c.in), mesh, tokens,
                                                    op.kind == op_kind::embedding ? 1 : op.in);
    const auto y = detail::largest_activation_block(out_layout, mesh, tokens, op.out);
    detail::price_compute(r, op, c.weight, x, y, seq, tp, m);
    detail::price_output_redistribution(r, out_layout, activation_layout(c.out), tokens, op.out,
                                        pricer);
    for (const auto& [wl, shape] : detail::op_parameters(op, c.weight))
        detail::price_parameter(r, wl, shape, hsdp_level, m, pricer);
    return r;
}

} // namespace xshard

