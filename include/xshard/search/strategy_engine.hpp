#pragma once
/// \file
/// The parallel modes' engines at run time: what `auto_parallel::compile()` runs for
/// parallel_mode recursive_programming and sharding_propagation on a model whose operator
/// strategies are set at run time (`strategy_searchable`: models/searched_mlp.hpp,
/// models/searched_transformer.hpp).
///
///  * recursive_programming: the search (search/recursive_programming.hpp) on the run's
///    degrees (dp x tp of the mesh, the pipeline's stages and micro-batches, the fastest
///    objective), then the strategies applied to the model.
///  * sharding_propagation: the strategies of the operator strategy file set by
///    load_operator_strategy_file (if any) kept, the others propagated
///    (search/sharding_propagation.hpp), then applied. With no file every operator is derived.
/// Either saves the operator strategy file set by save_operator_strategy_file (rank 0). Every
/// rank computes the same strategies from the same data (no communication); a bad file, or a
/// file for other degrees, raises on every rank (one agreement). Under a pipeline the plan's
/// stage of each operator is where the driver cuts a model whose operators are its modules
/// (`searched_chain`: searched_mlp).

#include <xshard/comm/agree.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/io/operator_strategy_file.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/operator_strategy.hpp>
#include <xshard/search/recursive_programming.hpp>
#include <xshard/search/search_options.hpp>
#include <xshard/search/searched_strategy.hpp>
#include <xshard/search/sharding_propagation.hpp>

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace xshard {

/// A model whose operators' strategies the engines set: `spec()` gives the network the search
/// prices, `apply_strategy(choices)` lays the model out (collective over its mesh).
template <class M>
concept strategy_searchable = requires(M& m, const std::vector<op_choice>& c) {
    { m.spec() } -> std::convertible_to<const network_spec&>;
    m.apply_strategy(c);
};

/// A strategy_searchable model that lists its operators as its modules, in the chain's order,
/// each a layer on the activations' type: a pipeline runs it, cut where the search's plan
/// cuts (searched_mlp; not searched_transformer, whose residuals cross its operators and
/// whose embedding takes ids).
template <class M>
concept searched_chain = strategy_searchable<M> && requires { requires M::operators_are_modules; };

/// The pipeline a run-time search prices: `stages` (the pipeline axis's size) and
/// `micro_batches` per step.
struct engine_pipeline {
    int stages = 1;
    int micro_batches = 1;
};

/// What the run-time engines search with on `mesh` (axes dp and tp) under `pipeline`: those
/// degrees, no hsdp, outputs split as the loss takes them, priced with `machine`, each rank
/// holding at most `memory_per_rank` bytes.
inline search_options
engine_options(const mesh_shape& mesh, const machine_model& machine = {},
               const engine_pipeline& pipeline = {},
               double memory_per_rank = std::numeric_limits<double>::infinity()) {
    search_options o;
    o.machine = machine;
    o.memory_per_rank = memory_per_rank;
    const int dp = mesh.axis_size("dp"), tp = mesh.axis_size("tp");
    o.ranks = dp * tp * pipeline.stages;
    o.degrees = parallel_degrees{dp, tp, pipeline.stages, pipeline.micro_batches, 0};
    o.hsdp_levels = {0};
    // The loss takes rows split like the labels: over dp, the classes whole or over tp.
    o.output_splits = {activation_split::rows, activation_split::features};
    return o;
}

/// Runs recursive_programming (`propagate` false) or sharding_propagation (true) for `model`
/// on `mesh` (axes dp and tp) under `pipeline`, loading and saving operator strategy files
/// where the paths are not empty (see the file comment), pricing with `machine`
/// (search/calibrate.hpp measures one), each rank holding at most `memory_per_rank` bytes.
/// Returns the plan applied. Collective over `comm`.
template <strategy_searchable M>
searched_strategy
run_strategy_engine(M& model, const mesh_shape& mesh, const communicator& comm, bool propagate,
                    const std::string& load_path = {}, const std::string& save_path = {},
                    const machine_model& machine = {}, const engine_pipeline& pipeline = {},
                    double memory_per_rank = std::numeric_limits<double>::infinity()) {
    const auto& net = model.spec();
    const auto o = engine_options(mesh, machine, pipeline, memory_per_rank);
    const auto d = *o.degrees;
    std::vector<std::optional<op_choice>> given(net.ops.size());
    if (propagate && !load_path.empty()) {
        const auto file = agreed<io_error>(comm, [&] {
            auto f = load_operator_strategy(load_path);
            if (f.degrees.dp != d.dp || f.degrees.tp != d.tp || f.degrees.pp != d.pp)
                throw io_error("xshard: operator strategy file " + load_path +
                               " is for dp=" + std::to_string(f.degrees.dp) +
                               " tp=" + std::to_string(f.degrees.tp) + " pp=" +
                               std::to_string(f.degrees.pp) + ", the run has dp=" +
                               std::to_string(d.dp) + " tp=" + std::to_string(d.tp) +
                               " pp=" + std::to_string(d.pp) + " (mesh " + mesh.to_string() +
                               ")");
            if (f.operators.size() != net.ops.size())
                throw io_error("xshard: operator strategy file " + load_path + " has " +
                               std::to_string(f.operators.size()) + " operators, the model " +
                               std::to_string(net.ops.size()));
            return f;
        });
        for (std::size_t i = 0; i < net.ops.size(); ++i)
            given[i] = file.operators[i].choice;
    }
    const auto plan = agreed(comm, [&] {
        if (propagate)
            return propagate_strategies(net, d, given, o);
        const auto r = search_strategy(net, o);
        if (!r.best)
            throw error("xshard: recursive_programming: no strategy for " + net.description +
                        (r.over_cap ? " fits " + std::to_string(std::uint64_t(o.memory_per_rank)) +
                                          " bytes per rank; the least is " +
                                          std::to_string(std::uint64_t(r.over_cap->memory_bytes))
                                    : std::string()));
        return *r.best;
    });
    model.apply_strategy(plan.choices);
    if (!save_path.empty())
        agreed<io_error>(comm, [&] {
            if (comm.rank() == 0)
                save_operator_strategy(save_path, make_operator_strategy(net, plan));
        });
    return plan;
}

} // namespace xshard
