#pragma once
/// \file
/// The cost model of the strategy search (MindSpore's auto-parallel cost model): what one
/// operator of a sequential network (search/network_spec.hpp) costs one rank under a
/// candidate strategy (core/op_choice.hpp), on a mesh of any size, computed in one process
/// without MPI. A stage of the pipeline runs its operators on a mesh (dp, tp). An operator's
/// costs per micro-batch and rank (`op_cost`):
///  * compute: forward and backward FLOPs (3x the forward GEMMs) at the GEMM speed of their
///    shapes (`machine_model::gemm_seconds`), elementwise work at `memory_bandwidth`;
///  * communication: the output's redistribution and its adjoint (the dual layouts, as
///    nn::kept_redistribution runs them), each priced by the redistribution planner's
///    candidates under the alpha-beta `cost_model` (search/redistribution_pricer.hpp); per
///    step the weight's gradient synchronisation at the hsdp level (train/hsdp.hpp: level 0 an
///    all-reduce, level 1 all-reduce then all-gather, level 2 reduce-scatter then all-gather)
///    and its optimizer update and zero_grad (memory-bound, on the shard under hsdp);
///  * memory: weights, gradients (sharded at level 2), optimizer state (sharded at levels 1
///    and 2), and the activations kept for the backward pass per micro-batch in flight.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/sharded_layout.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/op_options.hpp>
#include <xshard/search/redistribution_pricer.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// What one operator costs one rank of its stage (see the file comment). Times are seconds,
/// memory bytes.
struct op_cost {
    double compute = 0;            ///< per micro-batch, forward and backward
    double communication = 0;      ///< per micro-batch, the output's redistribution and its adjoint
    double synchronization = 0;    ///< per step, the weight's gradient synchronisation and update
    std::size_t comm_bytes = 0;    ///< per micro-batch, bytes sent (the redistributions)
    std::size_t sync_bytes = 0;    ///< per step, bytes sent (the gradient synchronisation)
    std::size_t weight_memory = 0; ///< weights, gradients, optimizer state
    std::size_t activation_memory = 0; ///< kept for the backward pass, per micro-batch
    bool valid = false;
};

namespace detail {

/// The largest block of `n` split `k` ways.
constexpr std::size_t largest_block(std::size_t n, std::size_t k) {
    return (n + k - 1) / k;
}

/// A weight's layout with its replicated axes of size > 1 (its data-parallel group) added to
/// one dimension, as train/hsdp.hpp shards it (core/sharded_layout.hpp); nullopt when it has
/// none.
XSHARD_DECL std::optional<layout> sharded_layout(const layout& w, const mesh_shape& mesh,
                                                 const std::vector<std::size_t>& shape);

/// The largest block a rank holds of a [tokens, features] activation laid out `l` on `mesh`
/// (the blocks on a dimension differ by one at most).
inline std::array<std::size_t, 2> largest_activation_block(const layout& l, const mesh_shape& mesh,
                                                           std::size_t tokens,
                                                           std::size_t features) {
    return {largest_block(tokens, std::size_t(l.split_count(0, mesh))),
            largest_block(features, std::size_t(l.split_count(1, mesh)))};
}

/// The compute time of `op` with weight split `w` (forward and backward) and the activations
/// it keeps for the backward pass, on input block `x` and output block `y` (the largest a rank
/// holds), `seq` tokens per sample and `tp` tensor-parallel ranks.
XSHARD_DECL void price_compute(op_cost& r, const op_spec& op, weight_split w,
                               const std::array<std::size_t, 2>& x,
                               const std::array<std::size_t, 2>& y, std::size_t seq, int tp,
                               const machine_model& m);

/// The output's redistribution `from` -> `to` of a [tokens, features] activation and its
/// adjoint (the dual layouts, as kept_redistribution runs them).
XSHARD_DECL void price_output_redistribution(op_cost& r, const layout& from, const layout& to,
                                             std::size_t tokens, std::size_t features,
                                             redistribution_pricer& pricer);

/// The parameters of `op` under weight split `w`, each its layout and global shape: a linear's
/// or an embedding's weight and bias, a normalisation's scale and shift (replicated); none
/// for the other operators.
XSHARD_DECL std::vector<std::pair<layout, std::vector<std::size_t>>>
op_parameters(const op_spec& op, weight_split w);

/// The elements of the largest block a rank holds of a tensor of `shape` laid out `l`.
XSHARD_DECL std::size_t largest_block_elements(const layout& l,
                                               const std::vector<std::size_t>& shape,
                                               const mesh_shape& mesh);

/// The gradient synchronisation of a weight of `shape` (1 to 4 dimensions) laid out `wl`,
/// priced by the planner:
/// unsharded its terms' all-reduce; sharded to `sharded` by hsdp, at level 1 the all-reduce
/// then the all-gather of the updated shards, at level 2 a reduce-scatter into the shards
/// then the all-gather.
XSHARD_DECL redistribution_price gradient_sync_price(const layout& wl,
                                                     const std::optional<layout>& sharded,
                                                     const std::vector<std::size_t>& shape,
                                                     int hsdp_level, redistribution_pricer& pricer);

/// Adds one parameter's memory (weight, gradient, optimizer state), gradient synchronisation
/// and update to `r`: the parameter has global `shape`, is laid out `wl`, and is sharded by
/// hsdp at `hsdp_level` when it reaches the machine's threshold.
XSHARD_DECL void price_parameter(op_cost& r, const layout& wl,
                                 const std::vector<std::size_t>& shape, int hsdp_level,
                                 const machine_model& m, redistribution_pricer& pricer);

} // namespace detail

/// The cost of operator `op` with strategy `c` on a stage's (dp, tp) mesh (`pricer`'s), with
/// `samples` samples of `seq` tokens per micro-batch and the hsdp level `hsdp_level`: invalid
/// when the operator cannot run with `c` (op_options), else its compute, its output's
/// redistribution and its parameters' memory and synchronisation (see the file comment).
XSHARD_DECL op_cost cost_of(const op_spec& op, const op_choice& c, std::size_t samples,
                            std::size_t seq, int hsdp_level, const machine_model& m,
                            redistribution_pricer& pricer);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/cost.ipp>
#endif
