#pragma once
/// \file
/// The options of optimizer sharding (train/hsdp.hpp): MindSpore's `hsdp(shard_size,
/// threshold, optimizer_level)` and the checks it makes of them.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace xshard {

/// What optimizer sharding splits (MindSpore's optimizer_level).
enum class optimizer_level {
    level1 = 1, ///< optimizer state and master weights
    level2 = 2, ///< also the gradients (reduce-scatter instead of all-reduce)
    level3 = 3, ///< also the weights between uses (ZeRO-3, FSDP)
};

/// "level1", "level2", "level3".
constexpr std::string_view to_string(optimizer_level l) {
    switch (l) {
    case optimizer_level::level1:
        return "level1";
    case optimizer_level::level2:
        return "level2";
    case optimizer_level::level3:
        return "level3";
    }
    return "unknown";
}

/// The level named `name` ("level1", "level2" or "level3"); throws xshard::error otherwise.
XSHARD_DECL optimizer_level parse_optimizer_level(std::string_view name);

/// MindSpore's `hsdp(shard_size, threshold, optimizer_level)`.
struct hsdp_options {
    /// The number of ranks one weight's update is split over: -1 for the weight's whole
    /// data-parallel group (its replicated mesh axes), else a positive divisor of that group
    /// (hybrid sharding: split over shard_size ranks, replicated over the rest). When it is
    /// the size of a set of the weight's replicated axes, the split is over those (the
    /// minor-most such set). Otherwise it is over part of one axis (with whole minor axes
    /// when needed): groups of shard_size / (whole axes) consecutive ranks of that axis (dp = 4
    /// with shard_size 2: ranks {0, 1} and {2, 3}), or, when that cannot make the size
    /// either (36 ranks and more: (4, 9) with 6), over parts of several axes, each group
    /// holding the whole sharded state, replicated across the groups. That state lives on the
    /// mesh of this rank's group (the same mesh type, the axes cut to the group's extent),
    /// where it is an ordinary layout; its reduce-scatter runs within the group, followed by
    /// an all-reduce of the block across the groups. Such a state saves into a checkpoint of
    /// either form (each tensor with its group's mesh and ranks, as the group of rank 0 holds
    /// it), and into a pipeline's checkpoint (pipeline/checkpoint.hpp: the group of its stage
    /// mesh's rank 0 writes it), that loads into any level, mesh, pipeline or world size.
    int shard_size = -1;
    /// Weights of fewer than this many KB (global shape x element size / 1024) stay unsharded.
    std::int64_t threshold = 64;
    xshard::optimizer_level optimizer_level = xshard::optimizer_level::level1;
    /// (xshard) Whether hsdp::backward also starts the all-reduce buckets (level1's sharded
    /// weights, unsharded weights) nonblocking as layers finish. Off by default: on one node
    /// xshard's blocking pairwise all-reduce, which then runs in synchronize_gradients, is
    /// faster than MPI's nonblocking one (measured with bench_training).
    bool overlap_allreduce = false;
};

namespace detail {

/// The first of MindSpore's conditions on hsdp options that `o` breaks, if any.
XSHARD_DECL std::optional<std::string> hsdp_options_problem(const hsdp_options& o);

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/hsdp_options.ipp>
#endif
