#pragma once
/// \file
/// The alpha-beta cost model that chooses between candidate plans and that plans print.
///
/// A step that sends m messages and moves b bytes (the larger of what one rank sends and
/// receives) and copies c bytes locally costs  alpha * m + beta * b + copy * c  seconds,
/// with alpha and beta set per kind of collective. For the named collectives on p ranks and
/// n bytes (n: the whole gathered, scattered or reduced buffer of the group) this gives the
/// textbook forms:
///
///     all_gather, all_to_all   (p-1) alpha + (p-1)/p n beta
///     reduce_scatter           (p-1) alpha + (p-1)/p n beta   (plus the local reduction)
///     all_reduce               2 (p-1) alpha + 2 (p-1)/p n beta
///
/// Steps among ranks of one node that run through shared-memory windows (node_step.hpp)
/// are priced by their own link, `shared_memory`, once the model knows the mesh is one
/// node (`node_local`, set by `on_node`):  alpha + beta * b + copy * c  per step, alpha
/// being the step's two node barriers and b the bytes a rank stages for, or reads from,
/// its peers.
///
/// Mesh axes can have links of their own (`axis_links`: e.g. an axis inside a node and one
/// across nodes; `calibrate_axis_links` fits them): a link is what the axis's wires allow,
/// and a kind's link what its algorithm reaches on the fastest wire, so a step whose group
/// spans configured axes is priced by the slowest of their links and its kind's (the largest
/// alpha and the largest beta). Measured on two hosts over 10 Gbit/s, that prices the steps
/// across them within 0.6-1.4 of their time (benchmarks/README.md, "Across hosts"), and keeps
/// within a node the kinds' own differences. The strategy search (search/cost.hpp)
/// prices every candidate layout through this one model.
///
/// The defaults are one fit by `bench_calibrate` (benchmarks/README.md says on what), which
/// prints a cost_model for the machine it runs on; only their ratios matter for choosing a
/// candidate, and printed predictions are as good as the fit. Set the fields to model
/// another network (e.g. alpha = 2e-6, beta = 1 / 12.5e9 for 100 Gb/s InfiniBand).

#include <xshard/comm/communicator.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/redistribute/planner.hpp>

#include <cstddef>

namespace xshard {

/// Latency (seconds per message) and inverse bandwidth (seconds per byte).
struct link_cost {
    double alpha;
    double beta;

    friend constexpr bool operator==(const link_cost&, const link_cost&) = default;
};

/// The link of one mesh axis (see `cost_model::axis_links`).
struct axis_link {
    axis_name axis;
    link_cost link;

    friend constexpr bool operator==(const axis_link&, const axis_link&) = default;
};

struct cost_model {
    // Fitted by bench_calibrate (2 ranks, 8 bytes and 64 MiB; see benchmarks/README.md).
    link_cost all_gather{0.9e-6, 1.0 / 3.9e9};
    link_cost all_to_all{0.5e-6, 1.0 / 3.3e9};
    link_cost reduce_scatter{1.0e-6, 1.0 / 3.3e9};
    link_cost all_reduce{0.6e-6, 1.0 / 2.7e9};
    link_cost exchange{0.5e-6, 1.0 / 3.3e9};
    /// Seconds per byte of a local copy (slice, zero, the part of an exchange a rank keeps).
    double copy = 1.0 / 5.4e9;
    /// The node-local path through shared-memory windows: alpha per step, beta per byte
    /// staged or read (bench_calibrate, 2 ranks).
    link_cost shared_memory{4.0e-6, 1.0 / 9.0e9};
    /// Whether the mesh's ranks share one node and allow the shared-memory transport (see
    /// `on_node`): steps of tensors of at least `reduce_tuning::shared_memory_min_bytes` are
    /// then priced by `shared_memory`.
    bool node_local = false;
    /// Per mesh axis links (empty: every axis alike, priced by kind).
    static_vector<axis_link, max_mesh_axes> axis_links{};

    friend constexpr bool operator==(const cost_model&, const cost_model&) = default;

    constexpr const link_cost& of(step_kind k) const {
        switch (k) {
        case step_kind::all_gather:
            return all_gather;
        case step_kind::all_to_all:
            return all_to_all;
        case step_kind::reduce_scatter:
            return reduce_scatter;
        case step_kind::all_reduce:
            return all_reduce;
        default: // exchange, and halo (point to point with the neighbouring bands)
            return exchange;
        }
    }

    /// The predicted seconds of a step of kind `k` (through shared memory when `shared`).
    constexpr double seconds(step_kind k, std::size_t messages, std::size_t bytes,
                             std::size_t copied, bool shared = false) const {
        if (shared)
            return shared_memory.alpha + shared_memory.beta * double(bytes) +
                   copy * double(copied);
        const auto& c = of(k);
        return c.alpha * double(messages) + c.beta * double(bytes) + copy * double(copied);
    }

    /// The link of a step of kind `k` over the axes `group` of `mesh`: the slowest of the
    /// kind's link and the links of the group's axes that have one (largest alpha, largest
    /// beta).
    constexpr link_cost link(step_kind k, const mesh_shape& mesh, axis_set group) const {
        link_cost worst = of(k);
        for (const auto& a : axis_links)
            for (std::size_t i = 0; i < mesh.names.size(); ++i)
                if (group.contains(i) && mesh.names[i] == a.axis && mesh.sizes[i] > 1) {
                    worst.alpha = worst.alpha > a.link.alpha ? worst.alpha : a.link.alpha;
                    worst.beta = worst.beta > a.link.beta ? worst.beta : a.link.beta;
                }
        return worst;
    }

    /// As `seconds`, priced by the link of the step's group (`link`).
    constexpr double seconds(step_kind k, const mesh_shape& mesh, axis_set group,
                             std::size_t messages, std::size_t bytes, std::size_t copied,
                             bool shared = false) const {
        if (shared || axis_links.empty())
            return seconds(k, messages, bytes, copied, shared);
        const auto c = link(k, mesh, group);
        return c.alpha * double(messages) + c.beta * double(bytes) + copy * double(copied);
    }

    /// This model with `node_local` set from `c`'s node map: whether all of `c`'s ranks
    /// share one node and allow the shared-memory transport. Collective over `c` (one
    /// MPI_Comm_split_type and one all-reduce of an int).
    cost_model on_node(const communicator& c) const {
        cost_model m = *this;
        m.node_local = node_group(c).whole_communicator_shares_memory();
        return m;
    }
};

/// Whether a step of kind `k` over `members` ranks, of a tensor of `tensor_bytes` bytes,
/// is one the shared-memory path runs when its members share a node: decided from data every
/// member has, so that every member alike takes part in the (collective) set-up or none does.
constexpr bool node_path_applies(step_kind k, int members, std::size_t tensor_bytes,
                                 const reduce_tuning& tuning) {
    return members > 1 && k != step_kind::zero && tensor_bytes >= tuning.shared_memory_min_bytes &&
           (k != step_kind::all_reduce || tuning.shared_memory_all_reduce);
}

} // namespace xshard
