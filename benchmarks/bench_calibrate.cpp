// Calibrates the cost model of redistribution plans on this machine, at the world size it
// runs on. For each kind of step it times a plan at a tiny and a large size (one JSON line
// each: measured seconds against the default model's prediction, ratio = measured /
// predicted), fits latency and bandwidth from the two (xshard::calibrate_links, which
// measure_machine runs too), and prints the fitted cost_model on stderr, ready to paste into
// include/xshard/redistribute/cost_model.hpp. The message links
// are timed with the shared-memory transport off; the `shared_memory` link (when the ranks
// share a node) with it on. The all_reduce link is MPI_Allreduce's (the pairwise all-reduce
// is priced by the reduce_scatter and all_gather links); the reduce_scatter link is the
// pairwise algorithm's.
//
// Then it finds the crossovers between the pairwise reductions and MPI's collectives
// (xshard::calibrate_reduce_tuning): for pieces of 1 KiB to 4 MiB per rank, an all-reduce
// and a reduce-scatter through each (one JSON line each: pairwise against MPI), and prints
// the reduce_tuning whose thresholds are the pieces from which on the pairwise path loses
// least over those timed; xshard::use_reduce_crossovers installs such crossovers in a
// program.
//
// Then the links of each level of the machine (xshard::calibrate_axis_links on a mesh of the
// nodes and the ranks of a node: level_* lines), and how well they predict plans at sizes
// they were not fitted at (see level_links).
//
//   mpirun -n 2 build/benchmarks/bench_calibrate

#include "harness.hpp"

#include <xshard/core.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/tensor.hpp>

#include <array>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace bench = xshard::bench;
using mesh_1d = xshard::mesh<"x">;
using levels_mesh = xshard::mesh<"node", "local">;

/// The links of each level (xshard::calibrate_axis_links) on the mesh (node, local): the nodes
/// by their blocks of consecutive ranks, the ranks of a node. Then, on each axis of more than
/// one rank, all its groups at once, plans of each kind at four sizes (the fit's two, 64 KiB
/// and 1 MiB between them), through messages: measured (the slowest rank's) against the
/// fitted model's prediction (one JSON line each, ratio = measured / predicted), with the
/// default model's prediction beside it. Returns the fitted links.
xshard::cost_model level_links(const xshard::communicator& world, const bench::options& o,
                               std::size_t large, const xshard::reduce_tuning& pairwise) {
    // Ranks per node: equal blocks of consecutive ranks, else every rank a level of its own.
    const xshard::node_group node(world);
    const int q = node.comm().size();
    std::array<int, 3> agree{q, -q, (world.rank() - node.comm().rank()) % q == 0 ? 1 : 0};
    xshard::mpi::allreduce(world, std::span(agree), xshard::reduction::min);
    const bool blocks = agree[0] == -agree[1] && agree[2] == 1;
    const levels_mesh levels(world, {xshard::auto_size, blocks ? q : 1});
    const auto fit = xshard::calibrate_axis_links(levels, {}, {.elements = large,
                                                               .repeats = std::max(o.reps, 1)});
    const xshard::reduce_tuning messages{.shared_memory_min_bytes = SIZE_MAX};
    const xshard::reduce_tuning through_mpi{.min_piece_bytes = SIZE_MAX,
                                            .shared_memory_min_bytes = SIZE_MAX,
                                            .reduce_scatter_min_piece_bytes = SIZE_MAX};
    for (std::size_t i = 0; i < levels_mesh::ndim; ++i) {
        const int p = levels.axis_size(i);
        if (p == 1)
            continue;
        const std::string axis(levels.shape().names[i].view());
        // The axis's groups as one-axis meshes "x", priced by the axis's fitted link.
        const mesh_1d g(levels.sub(xshard::axis_set::of(i)), {p});
        xshard::cost_model model = fit.links;
        model.axis_links = {};
        for (const auto& l : fit.links.axis_links)
            if (l.axis == levels.shape().names[i])
                model.axis_links.push_back({"x", l.link});
        const std::size_t tiny = std::size_t(p);
        for (const std::size_t n : {tiny, std::size_t(8192), std::size_t(131072), large}) {
            const auto timed = [&]<xshard::layout From, xshard::layout To>(
                                   const char* kind, const xshard::reduce_tuning& tuning) {
                const auto fitted = xshard::detail::time_link_plan<From, To>(
                    g, n, model, tuning, std::max(o.reps, 1));
                const auto guessed = xshard::detail::time_link_plan<From, To>(
                    g, n, xshard::cost_model{}, tuning, 1);
                double measured = fitted.seconds;
                xshard::mpi::allreduce(world, std::span(&measured, 1), xshard::reduction::max);
                char extra[160];
                std::snprintf(extra, sizeof extra,
                              "\"axis\": \"%s\", \"axis_ranks\": %d, \"default_predicted\": %.6g",
                              axis.c_str(), p, guessed.plan.seconds);
                bench::report(world, "level_" + axis + "_" + kind, fitted.bytes, "cost_model",
                              {measured, fitted.plan.seconds}, extra);
            };
            timed.operator()<"[x]", "[-]">("all_gather", messages);
            timed.operator()<"[x, -]", "[-, x]">("all_to_all", messages);
            timed.operator()<"[-] partial(sum: x)", "[x]">("reduce_scatter", pairwise);
            timed.operator()<"[-] partial(sum: x)", "[-]">("all_reduce", through_mpi);
        }
    }
    return fit.links;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const mesh_1d m({xshard::auto_size});
    const std::size_t small = std::size_t(m.size()), large = o.quick ? 1u << 16 : 8u << 20;

    // The message links (xshard::calibrate_links: the fastest of o.reps runs each).
    const auto links =
        xshard::calibrate_links(m.comm(), {}, {.elements = large, .repeats = std::max(o.reps, 1)});
    for (const auto& x : links.points)
        bench::report(m.comm(), "calibrate_" + x.kind, x.bytes, "cost_model",
                      {x.seconds, x.predicted});
    xshard::cost_model fitted = links.links;
    // The shared-memory path (when the ranks share a node): one all-to-all step, tiny and
    // large, through the windows; alpha per step, beta per byte staged or read.
    const auto node = xshard::cost_model{}.on_node(m.comm());
    if (node.node_local) {
        const xshard::reduce_tuning shared{.shared_memory_min_bytes = 0};
        const auto timed = [&](std::size_t n) {
            return xshard::detail::time_link_plan<"[x, -]", "[-, x]">(m, n, node, shared,
                                                                      std::max(o.reps, 1));
        };
        const auto tiny = timed(small), big = timed(large);
        for (const auto* x : {&tiny, &big})
            bench::report(m.comm(), "calibrate_shared_memory", x->bytes, "cost_model",
                          {x->seconds, x->plan.seconds});
        auto bytes_copied = [](const xshard::plan_summary& x, bool moved) {
            std::size_t n = 0;
            for (const auto& s : x.steps)
                n += moved ? std::max(s.bytes_sent, s.bytes_received) : s.bytes_copied;
            return double(n);
        };
        const double steps = double(big.plan.steps.size());
        fitted.shared_memory.alpha =
            std::max(0.0, (tiny.seconds - fitted.copy * bytes_copied(tiny.plan, false)) /
                              double(tiny.plan.steps.size()));
        fitted.shared_memory.beta =
            std::max(0.0, (big.seconds - fitted.copy * bytes_copied(big.plan, false) -
                           fitted.shared_memory.alpha * steps) /
                              bytes_copied(big.plan, true));
    }
    const xshard::reduce_tuning pairwise{.min_piece_bytes = 0,
                                         .shared_memory_min_bytes = SIZE_MAX,
                                         .reduce_scatter_min_piece_bytes = 0};
    const auto levels = level_links(m.comm(), o, large, pairwise);
    // The crossovers: per piece size, each reduction through the pairwise path against MPI.
    const auto crossovers = xshard::calibrate_reduce_tuning(
        m.comm(), {}, {.largest = o.quick ? 4u << 10 : 4u << 20, .repeats = std::max(o.reps, 1)});
    for (const auto& x : crossovers.points)
        bench::report(m.comm(), "crossover_" + x.kind, x.piece_bytes * std::size_t(m.size()),
                      "mpi", {x.pairwise, x.mpi},
                      "\"piece_bytes\": " + std::to_string(x.piece_bytes));
    const std::size_t all_reduce_from = crossovers.tuning.min_piece_bytes;
    const std::size_t reduce_scatter_from = crossovers.tuning.reduce_scatter_min_piece_bytes;

    if (m.rank() == 0) {
        auto bytes = [](std::size_t b) {
            return b == SIZE_MAX ? std::string("SIZE_MAX") : std::to_string(b);
        };
        std::fprintf(stderr,
                     "fitted reduce_tuning on %d ranks: {.min_piece_bytes = %s, "
                     ".reduce_scatter_min_piece_bytes = %s}\n",
                     m.size(), bytes(all_reduce_from).c_str(), bytes(reduce_scatter_from).c_str());
        auto line = [](const char* name, const xshard::link_cost& c) {
            std::fprintf(stderr, "    link_cost %s{%.3g, 1.0 / %.3g};\n", name, c.alpha,
                         1.0 / c.beta);
        };
        std::fprintf(stderr, "fitted cost_model on %d ranks:\n", m.size());
        line("all_gather", fitted.all_gather);
        line("all_to_all", fitted.all_to_all);
        line("reduce_scatter", fitted.reduce_scatter);
        line("all_reduce", fitted.all_reduce);
        line("exchange", fitted.exchange);
        line("shared_memory", fitted.shared_memory);
        std::fprintf(stderr, "    double copy = 1.0 / %.3g;\n", 1.0 / fitted.copy);
        for (const auto& l : levels.axis_links)
            std::fprintf(stderr, "  axis link %.*s (calibrate_axis_links): {%.3g, 1.0 / %.3g}\n",
                         int(l.axis.view().size()), l.axis.view().data(), l.link.alpha,
                         1.0 / l.link.beta);
    }
    return 0;
}
