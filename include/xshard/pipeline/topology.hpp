#pragma once
/// \file
/// Where a pipeline's stages live. A mesh axis (say "pp") holds the stages: the ranks that
/// differ only along it are one pipeline, and each stage runs on the sub-mesh of the other
/// axes (its *stage mesh*, `stage_mesh_of`). Stages may factor their ranks differently
/// (stage 0 on dp=2 x tp=2, stage 1 on dp=4 x tp=1), and each rank knows only its own stage
/// mesh, so the ranks learn every stage's mesh shape and its ranks on the whole mesh once,
/// when the pipeline is built. A boundary between two (virtual) stages is then a transfer
/// between corresponding ranks (transfer.hpp) where both sides lay the tensor out alike,
/// and a cross-mesh redistribution (boundary.hpp) where their meshes differ or the
/// receiving stage declares an input layout of its own.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/pipeline/boundary.hpp>
#include <xshard/pipeline/schedule.hpp>
#include <xshard/redistribute/cross_mesh.hpp>

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xshard::pipeline {

/// The stage mesh of `mesh` without axis `axis`: a `mesh<Others...>` over this rank's
/// sub-communicator of the other axes, with their sizes. `StageMesh` names the other axes
/// in order. Collective over the mesh.
template <mesh_type StageMesh, mesh_type FullMesh>
StageMesh stage_mesh_of(const FullMesh& mesh) {
    std::array<int, StageMesh::ndim> sizes{};
    axis_set others{};
    for (std::size_t i = 0; i < StageMesh::ndim; ++i) {
        const std::size_t a = mesh.shape().index(StageMesh::axis_names[i].view());
        sizes[i] = mesh.axis_size(a);
        others = others | axis_set::of(a);
    }
    return StageMesh(mesh.sub(others), sizes);
}

namespace detail {

/// Every stage's mesh and ranks as this rank sees them (see the file comment), with the
/// communicators the boundary transfers use.
template <mesh_type StageMesh>
struct stage_topology {
    /// This rank's stage mesh; `input_layouts` as `pipeline_options::stage_input_layouts`.
    stage_topology(const StageMesh& stage_mesh, std::map<int, layout> input_layouts)
        : mesh(stage_mesh)
        , input_layouts(std::move(input_layouts)) {}

    schedule_config config;
    communicator pp;    ///< this rank's pipeline: the ranks along the pipeline axis
    communicator cross; ///< the whole mesh (a duplicate), for the cross-mesh transfers
    StageMesh mesh;     ///< this rank's stage mesh
    std::map<int, layout> input_layouts; ///< (virtual) stage -> the layout it receives in
    std::vector<mesh_shape> shapes;      ///< every stage's mesh shape, per pipeline rank
    std::vector<placed_mesh> placed;     ///< every stage's mesh on the whole mesh's ranks

    /// Whether the boundary into (virtual) stage `s` (from s - 1) is a cross-mesh transfer.
    bool cross_boundary(int s) const {
        const auto a = std::size_t(config.rank_of_stage(s - 1)),
                   b = std::size_t(config.rank_of_stage(s));
        return !(shapes[a] == shapes[b]) || input_layouts.count(s);
    }

    /// The layout stage `s` receives its input in, when it was sent as `sent`.
    layout input_layout(int s, const layout& sent) const {
        const auto it = input_layouts.find(s);
        return it != input_layouts.end() ? it->second : sent;
    }

    /// Learns every stage's mesh shape and placement from this rank's `stage mesh` over
    /// axis `axis` of `full` (`pp` and `config` set), and checks the declared input layouts
    /// for a boundary tensor of rank `tensor_rank`; throws `xshard::error` on every rank
    /// when a check fails. Collective over `full`: one all-gather of the shapes, one
    /// agreement, and the duplicate `cross`.
    template <mesh_type FullMesh>
    void learn(const FullMesh& full, std::size_t axis, std::size_t tensor_rank) {
        constexpr std::size_t nd = StageMesh::ndim;
        const communicator& world = full.comm();
        std::vector<int> mine(nd), all(nd * std::size_t(world.size()));
        for (std::size_t i = 0; i < nd; ++i)
            mine[i] = mesh.shape().sizes[i];
        mpi::allgather(world, mine, all);
        agreed_alike(world, [&] {
            place_stages(full, axis, all);
            check_input_layouts(tensor_rank);
        });
        cross = world.dup();
    }

private:
    /// `shapes` and `placed` from every rank's stage mesh sizes (`all`, ndim per rank of
    /// `full`); throws when two ranks of one stage disagree on its mesh, or when this rank's
    /// stage mesh numbers its ranks otherwise than the other axes of `full`.
    template <mesh_type FullMesh>
    void place_stages(const FullMesh& full, std::size_t axis, const std::vector<int>& all) {
        constexpr std::size_t nd = StageMesh::ndim;
        const int p = pp.size();
        shapes.assign(std::size_t(p), {});
        std::vector<bool> seen(std::size_t(p), false);
        for (int r = 0; r < full.comm().size(); ++r) {
            const int s = full.shape().coords(r)[axis];
            mesh_shape shape = mesh.shape();
            for (std::size_t i = 0; i < nd; ++i)
                shape.sizes[i] = all[std::size_t(r) * nd + i];
            if (!seen[std::size_t(s)]) {
                shapes[std::size_t(s)] = shape;
                seen[std::size_t(s)] = true;
            } else if (!(shapes[std::size_t(s)] == shape)) {
                throw error("xshard: pipeline: the ranks of stage " + std::to_string(s) +
                            " disagree on its stage mesh (mesh(" +
                            shapes[std::size_t(s)].to_string() + ") and mesh(" + shape.to_string() +
                            "))");
            }
        }
        for (int s = 0; s < p; ++s)
            placed.push_back(placed_mesh::slice_of(full.shape(), axis, s, shapes[std::size_t(s)]));
        if (placed[std::size_t(pp.rank())].mesh_rank_of(full.comm().rank()) != mesh.rank())
            throw error("xshard: pipeline: the stage mesh numbers its ranks otherwise than the "
                        "mesh's other axes (make it over stage_mesh_of's communicator)");
    }

    /// Throws unless every declared input layout names a stage that receives inputs and
    /// suits a boundary tensor of rank `tensor_rank` on that stage's mesh.
    void check_input_layouts(std::size_t tensor_rank) const {
        for (const auto& [s, l] : input_layouts) {
            if (s < 1 || s >= config.total_stages())
                throw error("xshard: pipeline: stage_input_layouts names stage " +
                            std::to_string(s) + "; stages 1 to " +
                            std::to_string(config.total_stages() - 1) + " receive inputs");
            const auto& shape = shapes[std::size_t(config.rank_of_stage(s))];
            switch (check_boundary_layout(l, tensor_rank, shape.names)) {
            case boundary_problem::none:
                break;
            case boundary_problem::wrong_rank:
                throw error("xshard: pipeline: the input layout " + l.to_string() + " of stage " +
                            std::to_string(s) + " is not for a tensor of rank " +
                            std::to_string(tensor_rank));
            case boundary_problem::bad_layout:
                throw error("xshard: pipeline: the input layout " + l.to_string() + " of stage " +
                            std::to_string(s) + " does not fit its mesh(" + shape.to_string() +
                            ")");
            case boundary_problem::partial_input:
                throw error("xshard: pipeline: the input layout " + l.to_string() + " of stage " +
                            std::to_string(s) + " has a pending reduction");
            }
        }
    }
};

} // namespace detail

} // namespace xshard::pipeline
