#pragma once
/// \file
/// The definitions of what redistribute/geometry.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/redistribute/geometry.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::string axes_string(const mesh_shape& mesh, axis_set axes) {
    std::string s;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (axes.contains(i))
            s += (s.empty() ? "" : ",") + std::string(mesh.names[i].view());
    return s;
}

} // namespace detail

XSHARD_DECL double mpi_all_reduce_seconds(const cost_model& model, const mesh_shape& mesh,
                                          axis_set group, std::size_t p, std::size_t bytes) {
    return p > 1 ? model.seconds(step_kind::all_reduce, mesh, group, 2 * detail::ceil_log2(p),
                                 detail::all_reduce_bytes(bytes, p), 0)
                 : 0.0;
}

namespace detail {

XSHARD_DECL std::vector<int> candidate_ranks(const mesh_shape& mesh) {
    std::vector<int> ranks;
    const int p = mesh.size();
    const int stride = p <= 256 ? 1 : p / 64;
    for (long long r = 0; r < p; r += stride) // long long: r + stride may pass INT_MAX
        ranks.push_back(int(r));
    return ranks;
}

} // namespace detail

XSHARD_DECL std::size_t pick_candidate(const static_vector<candidate_price, 3>& prices) {
    std::size_t best = 0;
    bool best_fits = false;
    double best_seconds = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < prices.size(); ++i) {
        const auto& p = prices[i];
        if (!p.valid)
            continue;
        const bool better =
            (p.fits && !best_fits) || (p.fits == best_fits && p.slowest_rank < best_seconds);
        if (better) {
            best = i;
            best_fits = p.fits;
            best_seconds = p.slowest_rank;
        }
    }
    if (best_seconds == std::numeric_limits<double>::infinity() && !prices.empty())
        throw error("xshard: no valid redistribution plan (a bug)");
    return best;
}

XSHARD_DECL std::string describe(const plan_summary& p, const mesh_shape& mesh) {
    auto mib = [](std::size_t b) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3f MiB", double(b) / double(1 << 20));
        return std::string(buf);
    };
    auto us = [](double s) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
        return std::string(buf);
    };
    std::string out;
    if (p.steps.empty())
        return "nothing to do (the layouts give every rank the same block)\n";
    std::size_t i = 0;
    for (const auto& s : p.steps) {
        out += std::to_string(++i) + ". " + std::string(to_string(s.planned.kind));
        if (!s.planned.axes.empty()) {
            out += "(";
            for (std::size_t k = 0; k < s.planned.axes.size(); ++k)
                out += (k ? "," : "") + std::string(s.planned.axes[k].view());
            out += ")";
        }
        if (s.planned.kind == step_kind::halo)
            out += ": " + s.planned.from.to_string() + " + halo on dim " +
                   std::to_string(s.planned.dim) + "\n";
        else
            out += ": " + s.planned.from.to_string() + " -> " + s.planned.to.to_string() + "\n";
        out += "   over " +
               (s.group.empty() ? std::string("no communicator")
                                : "{" + s.group + "} (" + std::to_string(s.group_size) + " ranks)");
        out += ", " + std::to_string(s.messages) + " messages, sent " + mib(s.bytes_sent) +
               ", received " + mib(s.bytes_received) + ", copied " + mib(s.bytes_copied) +
               ", scratch " + mib(s.scratch_bytes) + ", " + us(s.seconds) + "\n";
    }
    out += "per rank: sent " + mib(p.bytes_sent()) + ", received " + mib(p.bytes_received()) +
           ", peak extra memory " + mib(p.peak_extra_bytes) + ", predicted " + us(p.seconds) +
           " on mesh(" + mesh.to_string() + ")\n";
    return out;
}

} // namespace xshard

