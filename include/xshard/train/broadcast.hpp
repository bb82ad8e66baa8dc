#pragma once
/// \file
/// Parameter broadcast (MindSpore's parameter_broadcast): every group of ranks holding
/// redundant copies of a parameter takes the values of one owner.
///
/// A parameter's redundant copies are the ranks along its replicated mesh axes (from its
/// layout): ranks that differ only along those axes hold the same block. For each such group
/// one owner is chosen, and the owners are spread so that every rank originates about as
/// many bytes as any other (as MindSpore's parameter_broadcast picks one owner per redundant
/// group): parameters in decreasing
/// size, each group's owner the member that owns the fewest bytes so far (ties: the lowest
/// rank) — computed alike on every rank, from shapes, layouts and names only. Fully sharded
/// parameters are untouched.
///
/// The owner broadcasts to its group: one MPI broadcast per bucket of parameters with the
/// same group and owner and element type (fusion, up to `fusion_mib`; 0 sends every
/// parameter on its own), all buckets in flight at once (nonblocking). A bucket travels as
/// one MPI datatype laid over its parameters' own memory, so fusion costs no pack buffer and
/// no copies. Per rank that moves
/// each redundant block once, against twice for MindSpore's "zero every non-owner copy, then
/// all-reduce", which also adds them up.
///
/// Pipeline stages: with `pipeline_stages` S the world's ranks form S consecutive stages and
/// the parameters live on the current stage's mesh; `initial_rank` must be the first world
/// rank of this rank's stage. All errors (a wrong `cur_rank` or `initial_rank`, a layout
/// dictionary naming a parameter the container does not have, a shard whose shape
/// contradicts its layout) are raised on every rank, before any data moves.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/train/fusion.hpp>
#include <xshard/param/traversal.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace xshard {

struct broadcast_options {
    /// This process's rank in MPI_COMM_WORLD (MindSpore's cur_rank); -1: not checked.
    int cur_rank = -1;
    /// The first world rank of this rank's pipeline stage.
    int initial_rank = 0;
    /// The number of pipeline stages the world is divided into.
    int pipeline_stages = 1;
    /// Bucket size in MiB (0: no fusion).
    double fusion_mib = 64;
    /// Layouts to use instead of the parameters' own (keys must name parameters).
    std::optional<layout_dict> layouts = std::nullopt;
};

/// Who owned what in a broadcast.
struct broadcast_report {
    /// Parameter name -> the mesh rank that owned this rank's copy (-1: not redundant).
    std::map<std::string, int> owner;
    /// Bytes each mesh rank originated (owned, times the copies it fed).
    std::vector<std::size_t> bytes_owned;
    std::size_t buckets = 0;
};

namespace detail {

/// The owners of every redundancy group, spread over the ranks (see the file comment).
/// Returns, per parameter, the owner (a mesh rank) of the group holding `rank`.
XSHARD_DECL std::vector<int> choose_owners(const std::vector<param_ref>& refs,
                                           broadcast_report& report);

} // namespace detail

/// Broadcasts every redundant parameter of `params` from its owner (see the file comment).
/// Collective over the parameters' mesh (every rank calls it with the same container
/// shape; the checks agree over the mesh of its first parameter). Returns which rank owned
/// what.
template <parameter_container C>
broadcast_report parameter_broadcast(C& params, const broadcast_options& options = {}) {
    broadcast_report report;
    auto refs = detail::param_refs(params, options.layouts ? &*options.layouts : nullptr);
    if (refs.empty())
        return report;
    const int world_rank = environment::world_rank(), world_size = environment::world_size();
    // Every check first, raised everywhere alike.
    std::optional<std::string> problem;
    const int stages = options.pipeline_stages;
    const int stage_size = stages > 0 && world_size % stages == 0 ? world_size / stages : 0;
    if (options.cur_rank >= 0 && options.cur_rank != world_rank)
        problem = "xshard: parameter_broadcast: cur_rank " + std::to_string(options.cur_rank) +
                  " is not this process's rank " + std::to_string(world_rank);
    else if (stage_size == 0 || options.initial_rank != world_rank / stage_size * stage_size)
        problem = "xshard: parameter_broadcast: initial_rank " +
                  std::to_string(options.initial_rank) + " is not the first rank of rank " +
                  std::to_string(world_rank) + "'s pipeline stage (" + std::to_string(stages) +
                  " stages of " + std::to_string(stage_size) + " ranks)";
    else
        problem = detail::first_problem(refs);
    agree_on_error(*refs.front().mesh_comm, problem);

    const auto owners = detail::choose_owners(refs, report);
    std::vector<std::size_t> redundant;
    for (std::size_t i = 0; i < refs.size(); ++i) {
        report.owner[refs[i].name] = owners[i];
        if (owners[i] >= 0)
            redundant.push_back(i);
    }
    if (redundant.empty())
        return report;
    const std::size_t limit =
        options.fusion_mib > 0 ? std::size_t(options.fusion_mib * double(1 << 20)) : 0;
    auto buckets = detail::make_buckets<std::tuple<std::uint32_t, int, std::type_index>>(
        refs, redundant, limit, [&](std::size_t i) {
            return std::tuple(refs[i].replicated.bits, owners[i], refs[i].type);
        });
    report.buckets = buckets.size();
    // Post every bucket's broadcast, then wait: several groups in flight. A bucket of several
    // parameters travels as one datatype over their own memory: no pack buffer, no copies.
    std::vector<derived_datatype> types;
    types.reserve(buckets.size());
    std::vector<request> pending;
    pending.reserve(buckets.size());
    for (auto& b : buckets) {
        const auto& first = refs[b.members.front()];
        b.root = first.mesh.group_rank(owners[b.members.front()], first.replicated);
        if (b.members.size() == 1) {
            pending.push_back(
                ibcast(*first.group, mpi_buffer{first.data, first.count, first.mpi_type}, b.root));
        } else {
            types.push_back(detail::fused_datatype(refs, b));
            pending.push_back(ibcast(*first.group, mpi_buffer::bottom(types.back()), b.root));
        }
    }
    wait_all(pending);
    return report;
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/broadcast.ipp>
#endif
