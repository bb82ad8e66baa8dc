#pragma once
/// \file
/// Checkpoints and strategy files of a pipeline: every stage's parameters in ONE integrated
/// checkpoint (io/checkpoint.hpp's form: one safetensors file holding every tensor whole,
/// under its module name, with its CRC-32s), written collectively by every rank of the
/// pipeline's mesh: each stage's ranks write the blocks of their own stage's parameters, one
/// copy of each replicated block, at their places in the one file. Its strategy (in the
/// header, and in the strategy file `save_pipeline_strategy_file` writes) gives each
/// parameter its layout, its stage (`"stage"`: its rank along the pipeline axis) and, when
/// its stage's mesh is not the first stage's, that mesh (stages may factor their ranks
/// differently), with the stage count. Optimizer state on copies of a mesh over part of a
/// stage's ranks (hsdp's shard_size over part of a mesh axis, train/hsdp.hpp) is written by
/// the copy holding its stage mesh's rank 0 and stored with that copy's mesh and `"ranks"`,
/// the pipeline mesh's ranks of that copy.
///
/// The save keeps io/checkpoint.hpp's contract: it yields a loadable checkpoint or raises the
/// same `io_error` on every rank and leaves the previous checkpoint at `path` intact.
///
/// Such a checkpoint loads into any strategy: into a model on one mesh (no pipeline) with
/// the ordinary `load_checkpoint(path, model)`, and into a pipeline of any cut, stage count,
/// stage meshes and world size with `load_pipeline_checkpoint(path, pipe)` (each stage loads
/// the modules it runs). A checkpoint of a model on one mesh (`save_checkpoint`) loads into
/// a pipeline the same way.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/io/checkpoint.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/pipeline/pipeline.hpp>

#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace xshard::pipeline {

namespace detail {

/// Every stage's tensors (parameters, then optimizer state under "optimizer."), on every
/// rank of the pipeline's mesh, in stage order: this rank's stage's as records of its
/// tensors (held unless a copy of a part of the stage other than the one that writes holds
/// them), the other stages' as records of their shape, element type, layout and mesh only
/// (not held, ckpt_model::held). Collective over the mesh (an all-gather of the
/// stages, one strategy broadcast per stage); an error raises on every rank.
template <class Model, distributed_tensor X, parameter_container S>
xshard::detail::ckpt_model every_stage(pipeline<Model, X>& pipe, const S& optimizer_state,
                                       bool all) {
    const auto& world = pipe.comm();
    xshard::detail::ckpt_model local;
    agreed_alike(world, [&] {
        xshard::detail::collect(local, pipe.local_parameters(), "", all);
        xshard::detail::collect(local, optimizer_state, "optimizer.", true);
    });
    // The lowest rank of each stage tells the others its stage's strategy. Each rank's stage
    // and rank on its stage's mesh (whose ranks a copy's "ranks" name), known everywhere.
    const int me = pipe.stage(), p = pipe.config().stages;
    std::vector<int> mine{me, local.comm ? local.comm->rank() : -1},
        places(2 * std::size_t(world.size()));
    mpi::allgather(world, mine, places);
    const auto stage_of = [&](int r) { return places[2 * std::size_t(r)]; };
    const auto world_rank = [&](int s, int stage_rank) {
        for (int r = 0; r < world.size(); ++r)
            if (stage_of(r) == s && places[2 * std::size_t(r) + 1] == stage_rank)
                return r;
        throw error("xshard: pipeline checkpoint: stage " + std::to_string(s) + " has no rank " +
                    std::to_string(stage_rank)); // (not reached: the stage's ranks sent it)
    };
    xshard::detail::ckpt_model m;
    m.comm = &world;
    m.strategy.pipeline_stages = p;
    bool first = true;
    for (int s = 0; s < p; ++s) {
        int root = 0;
        while (root < world.size() && stage_of(root) != s)
            ++root;
        const auto text = xshard::detail::message_from(
            world, root, world.rank() == root ? std::optional(local.strategy.to_json())
                                              : std::nullopt);
        strategy_file stage;
        xshard::detail::everywhere(world, [&] { stage = strategy_file::from_json(text); });
        if (!stage.parameters.empty() && first) {
            m.strategy.mesh = stage.mesh;
            first = false;
        }
        for (std::size_t j = 0; j < stage.parameters.size(); ++j) {
            auto e = stage.parameters[j];
            e.stage = s;
            // A tensor on copies of a mesh over part of the stage's ranks (hsdp's state
            // sharded over part of a mesh axis) keeps its copy's mesh; its "ranks", the
            // stage mesh's ranks of the copy that writes it, become the pipeline's.
            if (e.mesh)
                for (auto& r : e.ranks)
                    r = world_rank(s, r);
            else if (!(stage.mesh == m.strategy.mesh))
                e.mesh = stage.mesh;
            if (s == me) {
                m.tensors.push_back(local.tensors.at(j));
            } else {
                tensor_record t;
                t.name = e.name;
                t.element = dtype_size(e.dtype);
                t.shape = e.shape;
                t.lay = e.lay;
                t.mesh = e.mesh ? *e.mesh : stage.mesh;
                t.replicated = e.lay.replicated_axes(t.mesh);
                t.trainable = e.trainable;
                m.tensors.push_back(std::move(t));
            }
            // Of a tensor on copies of a part of the stage, only the copy named by its
            // "ranks" writes (collect's choice).
            m.held.push_back(s == me && local.holds(j));
            m.dtypes.push_back(e.dtype);
            m.strategy.parameters.push_back(std::move(e));
        }
    }
    // (Every rank holds the same names: the same error everywhere.)
    if (m.tensors.empty())
        throw error("xshard: pipeline checkpoint: the pipeline has no parameters to save");
    xshard::detail::check_names(m);
    return m;
}

} // namespace detail

/// The strategy of the whole pipeline (every stage's parameters, trainable ones unless
/// `all`, each with its stage and, where it differs from the first stage's, its stage's
/// mesh), on every rank. Collective over the pipeline's mesh.
template <class Model, distributed_tensor X>
strategy_file pipeline_strategy(pipeline<Model, X>& pipe, bool all = false) {
    return detail::every_stage(pipe, std::tuple<>{}, all).strategy;
}

/// Writes `pipeline_strategy(pipe, all)` to `path` (rank 0 writes, durably and atomically).
/// Collective over the pipeline's mesh; a failure raises io_error on every rank.
template <class Model, distributed_tensor X>
void save_pipeline_strategy_file(const std::string& path, pipeline<Model, X>& pipe,
                                 bool all = false) {
    const auto f = pipeline_strategy(pipe, all);
    xshard::detail::on_rank0(pipe.comm(),
                             [&] { xshard::detail::write_file_atomically(path, f.to_json()); });
}

/// Saves every stage's parameters (trainable ones unless `options.all_parameters`) and
/// `optimizer_state` (this rank's stage's, e.g. its optimizer's state over
/// `pipe.local_parameters()`) into the one integrated checkpoint `path`, with
/// `options.step` (see the file comment). Collective over the pipeline's mesh; a failure
/// anywhere raises io_error on every rank and leaves the previous checkpoint intact. Only
/// the integrated form: a per-rank directory has one mesh.
template <class Model, distributed_tensor X, parameter_container S = std::tuple<>>
void save_pipeline_checkpoint(const std::string& path, pipeline<Model, X>& pipe,
                              const checkpoint_options& options = {},
                              const S& optimizer_state = {}) {
    if (options.format != checkpoint_format::integrated)
        throw error("xshard: pipeline checkpoint: a pipeline saves one integrated checkpoint "
                    "(checkpoint_format::integrated)");
    auto m = detail::every_stage(pipe, optimizer_state, options.all_parameters);
    xshard::detail::save_integrated(m, path, options.step);
}

/// Loads a checkpoint (a pipeline's, or a model's on one mesh, either form) into a pipeline
/// of any cut, stage count, stage meshes and world size: each stage the modules it runs (and
/// `optimizer_state`, this rank's stage's), collectively over its stage mesh. Collective
/// over the pipeline's mesh; a failure anywhere (a missing file or tensor, a damaged block)
/// raises io_error on every rank (a mismatch before anything is read changes nothing).
template <class Model, distributed_tensor X, parameter_container S = std::tuple<>>
checkpoint_info load_pipeline_checkpoint(const std::string& path, pipeline<Model, X>& pipe,
                                         S&& optimizer_state = {}, bool all_parameters = false) {
    bool any = false;
    const auto count = [&](const std::string&, const auto&) { any = true; };
    for_each_parameter(pipe.local_parameters(), count);
    for_each_parameter(optimizer_state, count);
    return agreed_alike<io_error>(pipe.comm(), [&] {
        if (any)
            return load_checkpoint(path, pipe.local_parameters(), std::forward<S>(optimizer_state),
                                   all_parameters);
        // A stage without parameters (activations only) loads nothing; it learns the step.
        const checkpoint_reader r(path);
        return checkpoint_info{r.step(), r.format(), r.strategy()};
    });
}

} // namespace xshard::pipeline
