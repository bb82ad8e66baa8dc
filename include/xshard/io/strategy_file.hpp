#pragma once
/// \file
/// Strategy files (MindSpore's save/load_param_strategy_file): for each parameter its global
/// shape, element type and layout, with the mesh and the pipeline-stage count. JSON, version 1:
///
///     {
///       "format": "xshard-strategy", "version": 1,
///       "mesh": {"axes": ["dp", "mp"], "sizes": [2, 2]},
///       "pipeline_stages": 1,
///       "parameters": [
///         {"name": "layer1.weight", "shape": [784, 512], "dtype": "F64",
///          "layout": "[-, mp]", "trainable": true}
///       ]
///     }
///
/// dtypes are safetensors' ("F64", "F32", "F16", "BF16", "I64", ...), layouts are in xshard's
/// notation. A pipeline's strategy (pipeline/checkpoint.hpp) also gives each parameter its
/// `"stage"` (the rank along the pipeline axis that holds it), and its own `"mesh"` where
/// its stage's mesh is not the file's (stages may factor their ranks differently); a
/// parameter without one is on the file's mesh. A tensor on copies of a mesh over part of
/// the ranks (hsdp's state sharded over part of a mesh axis) has its copy's `"mesh"` and
/// `"ranks"`, the file's ranks that held the copy holding rank 0, in its mesh's rank order
/// (in a pipeline's strategy: the pipeline's ranks, of the copy holding its stage mesh's
/// rank 0; the stages' meshes together have `pipeline_stages` times the file's mesh's ranks).
/// Only trainable parameters are written unless `all_parameters` is set.
/// Loading gives run-time layouts that redistribution and checkpoint loading use directly.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/param/traversal.hpp>

#include <nlohmann/json.hpp>

#include <climits>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace xshard {

/// One parameter of a strategy file.
struct strategy_entry {
    std::string name;
    std::vector<std::size_t> shape;
    std::string dtype;
    layout lay;
    bool trainable = true;
    /// The pipeline stage holding it: its rank along the pipeline axis (-1: not pipelined).
    int stage = -1;
    /// Its mesh, when it is not the file's (a pipeline stage's mesh, or a copy over part of
    /// the file's ranks: hsdp's state sharded over part of a mesh axis).
    std::optional<mesh_shape> mesh = std::nullopt;
    /// With `mesh` a copy over part of the file's ranks: the file's ranks that held that
    /// mesh's ranks, in order (the copy holding rank 0, whose blocks a per-rank checkpoint
    /// reads from their rank files; in a pipeline's strategy the pipeline mesh's ranks of the
    /// copy holding its stage mesh's rank 0). Empty otherwise.
    std::vector<int> ranks = {};
};

/// The contents of a strategy file.
struct strategy_file {
    static constexpr int current_version = 1;
    mesh_shape mesh;
    int pipeline_stages = 1;
    std::vector<strategy_entry> parameters;

    /// The mesh parameter `e` was laid out on.
    const mesh_shape& mesh_of(const strategy_entry& e) const { return e.mesh ? *e.mesh : mesh; }

    const strategy_entry* find(std::string_view name) const;

    /// name -> layout, for parameter_broadcast, gradient synchronisation and redistribution.
    layout_dict layouts() const;

    /// The envelope of strategy files (io/json_envelope.hpp).
    static constexpr json_file_kind kind{"xshard-strategy", current_version, "strategy file"};

    std::string to_json() const;

    /// Parses a strategy file's text strictly (its envelope as read_envelope checks it;
    /// integers are integers in range, names are strings, lists are lists, no name twice);
    /// throws io_error naming what is wrong, and the file when `path` (where the text was
    /// read) is given.
    static strategy_file from_json(std::string_view text, const std::string& path = {});

    /// Throws io_error, naming both meshes, unless the file's mesh has `current`'s axes and
    /// sizes.
    void check_mesh(const mesh_shape& current) const;

private:
    /// One entry of a strategy file's "parameters" (of file `f`, whose mesh and stage count
    /// are read; `seen`: the names before it), checked strictly; io_error naming what is
    /// wrong.
    static strategy_entry parse_parameter(const nlohmann::json& p, const strategy_file& f,
                                          std::set<std::string>& seen);

    /// The "ranks" of parameter `e` (named `name`) of file `f`: one distinct rank of the
    /// file's ranks per rank of the parameter's own mesh.
    static std::vector<int> parse_ranks(const nlohmann::json& r, const strategy_entry& e,
                                        const strategy_file& f, const std::string& name);
};

/// The strategy of a parameter container (trainable parameters only, unless `all`).
template <parameter_container C>
strategy_file strategy_of(const C& params, bool all = false, int pipeline_stages = 1) {
    strategy_file f;
    f.pipeline_stages = pipeline_stages;
    for_each_parameter(params, [&](const std::string& name, const auto& t, bool trainable) {
        using D = std::remove_cvref_t<decltype(t)>;
        f.mesh = t.mesh().shape();
        if (trainable || all)
            f.parameters.push_back(
                {name, std::vector<std::size_t>(t.shape().begin(), t.shape().end()),
                 std::string(dtype_of<typename D::value_type>().name), t.layout(), trainable});
    });
    return f;
}

/// Writes the strategy of `params` to `path` (durably, replacing it atomically). Every rank
/// may call it; rank 0 of the parameters' mesh writes, and a failure there raises io_error on
/// every rank (detail::on_rank0). Collective over the mesh (one all-reduce of an int).
template <parameter_container C>
void save_strategy_file(const std::string& path, const C& params, bool all = false,
                        int pipeline_stages = 1) {
    const auto f = strategy_of(params, all, pipeline_stages);
    const auto records = parameter_records(params);
    const communicator* comm = records.empty() ? nullptr : records.back().mesh_comm;
    const auto write = [&] {
        detail::write_file_atomically(path, f.to_json());
    };
    if (comm)
        detail::on_rank0(*comm, write);
    else
        write(); // (no parameters, no mesh: nobody else to tell)
}

/// Reads the strategy file at `path` (strategy_file::from_json; its errors name the file).
inline strategy_file load_strategy_file(const std::string& path) {
    return strategy_file::from_json(detail::read_file(path), path);
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/strategy_file.ipp>
#endif
