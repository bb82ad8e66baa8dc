#pragma once
/// \file
/// The definitions of what search/calibrate.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/calibrate.hpp>

namespace xshard {

XSHARD_DECL link_fit calibrate_links(const communicator& c, const cost_model& base,
                                     const link_sample& sample) {
    link_fit fit{base, {}};
    if (c.size() == 1)
        return fit;
    const mesh<"x"> m(c, {c.size()});
    const int repeats = std::max(1, sample.repeats);
    const std::size_t tiny = std::size_t(m.size()), large = std::max(sample.elements, tiny);
    std::vector<char> a(large * sizeof(double), 1), b(a.size());
    fit.links.copy = detail::slowest_rank_seconds(
                         c, repeats, 1, [&] { std::memcpy(b.data(), a.data(), a.size()); }) /
                     double(a.size());
    const auto fit_kind = [&](const char* kind, link_cost& into, const auto& timed) {
        const detail::timed_plan small = timed(tiny), big = timed(large);
        // t = alpha * messages + beta * bytes + copy * copied, from the two sizes.
        const auto terms = [](const plan_summary& p) {
            std::array<double, 3> t{};
            for (const auto& s : p.steps) {
                t[0] += double(s.messages);
                t[1] += double(std::max(s.bytes_sent, s.bytes_received));
                t[2] += double(s.bytes_copied);
            }
            return t;
        };
        const auto t0 = terms(small.plan), t1 = terms(big.plan);
        if (t0[0] > 0)
            into.alpha = std::max(0.0, (small.seconds - fit.links.copy * t0[2]) / t0[0]);
        if (t1[1] > 0)
            into.beta =
                std::max(0.0, (big.seconds - fit.links.copy * t1[2] - into.alpha * t1[0]) / t1[1]);
        for (const auto* x : {&small, &big})
            fit.points.push_back({kind, x->bytes, x->seconds, x->plan.seconds});
    };
    const reduce_tuning messages{.shared_memory_min_bytes = SIZE_MAX};
    const reduce_tuning pairwise{.min_piece_bytes = 0,
                                 .shared_memory_min_bytes = SIZE_MAX,
                                 .reduce_scatter_min_piece_bytes = 0};
    const reduce_tuning through_mpi{.min_piece_bytes = SIZE_MAX,
                                    .shared_memory_min_bytes = SIZE_MAX,
                                    .reduce_scatter_min_piece_bytes = SIZE_MAX};
    fit_kind("all_gather", fit.links.all_gather, [&](std::size_t n) {
        return detail::time_link_plan<"[x]", "[-]">(m, n, base, messages, repeats);
    });
    fit_kind("all_to_all", fit.links.all_to_all, [&](std::size_t n) {
        return detail::time_link_plan<"[x, -]", "[-, x]">(m, n, base, messages, repeats);
    });
    // exchange: the same movement as all_to_all, named by the planner when several axes move.
    fit.links.exchange = fit.links.all_to_all;
    fit_kind("reduce_scatter", fit.links.reduce_scatter, [&](std::size_t n) {
        return detail::time_link_plan<"[-] partial(sum: x)", "[x]">(m, n, base, pairwise, repeats);
    });
    // MPI_Allreduce runs below the pairwise algorithm's pieces only (reduce_tuning's
    // min_piece_bytes per member): its bandwidth is fitted at that size, not above it.
    const std::size_t mpi_largest = std::clamp(
        reduce_tuning{}.min_piece_bytes / sizeof(double) * std::size_t(m.size()), tiny, large);
    fit_kind("all_reduce", fit.links.all_reduce, [&](std::size_t n) {
        return detail::time_link_plan<"[-] partial(sum: x)", "[-]">(m, std::min(n, mpi_largest),
                                                                    base, through_mpi, repeats);
    });
    return fit;
}

XSHARD_DECL link_fit detail::calibrate_axis_links(const communicator& whole,
                                                  const mesh_shape& shape,
                                                  std::span<const communicator* const> groups,
                                                  const cost_model& base,
                                                  const link_sample& sample) {
    link_fit fit{base, {}};
    // The copy, then alpha and beta of all_gather, all_to_all, reduce_scatter, all_reduce:
    // per axis the slowest group's; over the axes the fastest kinds, the slowest copy.
    std::array<double, 9> kinds{};
    bool fitted = false;
    for (std::size_t i = 0; i < shape.names.size(); ++i) {
        if (shape.sizes[i] <= 1) // (the shape is the same on every rank)
            continue;
        const auto one = calibrate_links(*groups[i], base, sample);
        const auto& l = one.links;
        std::array<double, 9> axis{l.copy,
                                   l.all_gather.alpha,
                                   l.all_gather.beta,
                                   l.all_to_all.alpha,
                                   l.all_to_all.beta,
                                   l.reduce_scatter.alpha,
                                   l.reduce_scatter.beta,
                                   l.all_reduce.alpha,
                                   l.all_reduce.beta};
        allreduce(whole, std::span(axis), reduction::max);
        for (std::size_t k = 0; k < kinds.size(); ++k)
            kinds[k] = !fitted ? axis[k] : k == 0 ? std::max(kinds[k], axis[k])
                                                  : std::min(kinds[k], axis[k]);
        fitted = true;
        const axis_link link{shape.names[i], {axis[3], axis[4]}};
        auto& links = fit.links.axis_links;
        const auto kept = std::find_if(links.begin(), links.end(),
                                       [&](const axis_link& a) { return a.axis == link.axis; });
        if (kept != links.end())
            *kept = link;
        else
            links.push_back(link);
        for (auto p : one.points) {
            p.kind = std::string(shape.names[i].view()) + "." + p.kind;
            fit.points.push_back(std::move(p));
        }
    }
    if (fitted) {
        auto& l = fit.links;
        l.copy = kinds[0];
        l.all_gather = {kinds[1], kinds[2]};
        l.all_to_all = {kinds[3], kinds[4]};
        l.exchange = l.all_to_all;
        l.reduce_scatter = {kinds[5], kinds[6]};
        l.all_reduce = {kinds[7], kinds[8]};
    }
    return fit;
}

XSHARD_DECL crossover_fit calibrate_reduce_tuning(const communicator& c,
                                                  const reduce_tuning& base,
                                                  const crossover_sample& sample) {
    crossover_fit fit{base, {}};
    if (c.size() == 1)
        return fit;
    const mesh<"x"> m(c, {c.size()});
    const std::size_t p = std::size_t(c.size());
    auto with = [&](std::size_t from) {
        reduce_tuning t = base;
        t.min_piece_bytes = t.reduce_scatter_min_piece_bytes = from;
        t.shared_memory_min_bytes = SIZE_MAX;
        return t;
    };
    const reduce_tuning pairwise = with(0), through_mpi = with(SIZE_MAX);
    std::vector<std::size_t> pieces;
    for (std::size_t piece = std::max(sample.smallest, sizeof(double)); piece <= sample.largest;
         piece *= 4) {
        pieces.push_back(piece);
        if (piece > sample.largest / 4)
            break;
    }
    if (pieces.empty())
        return fit;
    const auto fit_kind = [&]<layout To>(const char* kind) {
        const std::size_t first = fit.points.size();
        for (const std::size_t piece : pieces) {
            auto src = full<double, "[-] partial(sum: x)">(m, {piece / sizeof(double) * p}, 1.0);
            auto a = make_redistribution<To>(src, To, {}, pairwise);
            auto b = make_redistribution<To>(src, To, {}, through_mpi);
            auto dst = a(src);
            // Runs of about 256 KiB per member, so that a short reduction's clock and barrier
            // do not matter; the two paths in turn, so that drifting load affects both alike.
            const int calls = int(std::clamp(std::size_t(256 << 10) / piece, std::size_t(1),
                                             std::size_t(64)));
            const auto run = [&](auto& plan) {
                return detail::slowest_rank_seconds(c, 1, calls,
                                                    [&] { plan.execute_unchecked(src, dst); });
            };
            double best[2] = {std::numeric_limits<double>::infinity(),
                              std::numeric_limits<double>::infinity()};
            for (int r = 0; r < std::max(1, sample.repeats); ++r) {
                best[0] = std::min(best[0], run(a));
                best[1] = std::min(best[1], run(b));
            }
            fit.points.push_back({kind, piece, best[0], best[1]});
        }
        return detail::crossover_from(std::span(fit.points).subspan(first), sample.margin);
    };
    fit.tuning.min_piece_bytes = fit_kind.operator()<"[-]">("all_reduce");
    fit.tuning.reduce_scatter_min_piece_bytes = fit_kind.operator()<"[x]">("reduce_scatter");
    return fit;
}

XSHARD_DECL void fit_gemm(machine_model& m, double narrow, double narrow_dimension, double wide,
                          double wide_dimension) {
    m.gemm_flops = wide;
    m.gemm_half_dimension = 0;
    if (!(narrow > 0 && narrow < wide && narrow_dimension > 0 && narrow_dimension < wide_dimension))
        return;
    // 1 / speed = a + b / d, with a = 1 / peak and b = h / peak.
    const double b = (1 / narrow - 1 / wide) / (1 / narrow_dimension - 1 / wide_dimension);
    const double a = std::max(1 / wide - b / wide_dimension, 0.5 / wide);
    m.gemm_flops = 1 / a;
    m.gemm_half_dimension = (1 / wide - a) * wide_dimension / a;
}

XSHARD_DECL machine_model calibrate_ops(const communicator& c, machine_model base,
                                        const program_profile& measured,
                                        const program_strategy& priced) {
    std::map<std::string, double> seconds_of;
    for (const auto& n : measured.nodes)
        seconds_of[n.node] = n.forward + n.backward;
    // Per primitive, in name order (the same on every rank): measured seconds per step,
    // priced seconds.
    std::map<std::string, std::array<double, 2>> ops;
    bool fits = measured.forward_passes > 0;
    for (const auto& n : priced.nodes) {
        const auto it = seconds_of.find(n.node);
        fits = fits && it != seconds_of.end();
        auto& op = ops[n.op];
        if (it != seconds_of.end())
            op[0] += it->second / double(std::max<std::size_t>(measured.forward_passes, 1));
        op[1] += n.compute;
    }
    const auto counts = value_ranges<1>(c, {ops.size()});
    agree_on_error(
        c, fits && counts[0].agrees()
               ? std::nullopt
               : std::optional<std::string>(
                     "xshard: calibrate_ops: the profile holds no step of the strategy's "
                     "program on every rank (profile_steps, then run a step, on the program "
                     "compiled with it)"));
    std::vector<double> slowest;
    for (const auto& [name, t] : ops)
        slowest.push_back(t[0]);
    allreduce(c, std::span(slowest), reduction::max);
    std::size_t k = 0;
    for (const auto& [name, t] : ops) {
        const double was = base.scale_of(name), now = slowest[k++];
        if (t[1] > 0 && now > 0)
            base.set_scale_of(name, was * now / t[1]);
    }
    return base;
}

} // namespace xshard

