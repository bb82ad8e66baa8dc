#pragma once
/// \file
/// Redistribution of distributed tensors: `redistribute<To>(t)` for a one-off, and
/// `make_redistribution<To>(t)` for a plan built once and run many times.
///
/// What is decided when: the candidate step sequences are constexpr (computed when the
/// template is instantiated, for layout types); the choice among them (the cost model, for
/// the actual mesh sizes, shape and element type), the geometry (extents, offsets, counts)
/// and the MPI datatypes are computed at run time, when a plan is built.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/plan.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace xshard {

namespace detail {

/// The candidates from `from` to `to`: computed at compile time when both are layout types.
template <layout From, layout To>
plan_candidates candidates_for(const layout& from, const layout& to) {
    if constexpr (!From.dynamic && !To.dynamic) {
        static constexpr plan_candidates fixed = plan_redistribution(From, To);
        return fixed;
    } else {
        return plan_redistribution(from, to);
    }
}

/// Whether this rank's shard of `t` still has the shape its layout gives it.
template <distributed_tensor D>
bool shard_resized(const D& t) {
    return to_array<D::rank>(t.local().shape()) != t.block().extent;
}

} // namespace detail

/// A plan turning tensors of type D (on D's mesh, with D's global shape) into layout To.
/// Built once (planning, MPI datatypes, buffers), run many times: calling it checks the
/// tensor against the plan on every rank alike, then runs the plan, allocating only the
/// result (`execute` into an existing tensor allocates nothing).
template <distributed_tensor D, layout To>
class redistribution {
public:
    using source_type = D;
    using result_type = dtensor<typename D::value_type, typename D::mesh_type, To>;
    static constexpr std::size_t rank = D::rank;

    redistribution(const D& like, const layout& to = To, const cost_model& model = {},
                   const reduce_tuning& tuning = {})
        : mesh_(like.mesh())
        , from_(like.layout())
        , to_(detail::layout_for<To>(to, like.mesh().shape()))
        , plan_(like.mesh(), like.shape(),
                detail::candidates_for<D::static_layout, To>(like.layout(), to_), model, tuning) {}

    /// The result of redistributing `t`. Collective.
    result_type operator()(const D& t) {
        result_type out(detail::unchecked, mesh_, t.shape(),
                        result_type::local_type::from_shape(plan_.destination_block().extent), to_);
        execute(t, out);
        return out;
    }

    /// Redistributes `t` into `out` (a tensor of the destination layout and the same global
    /// shape, e.g. the result of an earlier call). Collective; allocates nothing. Checks
    /// the tensors against the plan, including (one all-reduce of an int) that no rank's
    /// shard was resized, so that misuse throws on every rank.
    void execute(const D& t, result_type& out) {
        check_common(t, out);
        std::optional<std::string> resized;
        if (detail::shard_resized(t) || detail::shard_resized(out))
            resized = "xshard: redistribute: a local shard was resized (it no longer has the shape "
                      "its layout gives it)";
        agree_on_error(mesh_.comm(), resized);
        plan_.execute(t.local().data(), out.local().data());
    }

    /// `execute` without the all-reduce that guards against resized shards: for loops in
    /// which the caller knows the shards keep their shapes. The checks every rank can make
    /// alone (mesh, shape, layout) still run.
    void execute_unchecked(const D& t, result_type& out) {
        check_common(t, out);
        check_local(t, out);
        plan_.execute(t.local().data(), out.local().data());
    }

    /// Whether this plan is for tensors like `t` going to layout `to` (same mesh, global
    /// shape and layouts).
    bool fits(const D& t, const layout& to) const {
        return t.mesh() == mesh_ && t.shape() == plan_.shape() && t.layout() == from_ && to == to_;
    }

    /// The underlying plan (its summary, its printout).
    const redistribution_plan<typename D::value_type, rank>& plan() const noexcept { return plan_; }
    /// The plan's printout: steps, communicators, bytes, memory, predicted time.
    std::string describe() const { return plan_.describe(); }

private:
    /// What every rank can check alone, from data every rank has: every rank throws
    /// alike, before any message.
    void check_common(const D& t, const result_type& out) const {
        if (!(t.mesh() == mesh_) || !(out.mesh() == mesh_))
            throw error("xshard: redistribution: the tensor lives on another mesh than the plan");
        if (t.shape() != plan_.shape() || out.shape() != plan_.shape())
            throw error("xshard: redistribution: the plan is for global shape " +
                        detail::shape_string(plan_.shape()) + ", the tensor has " +
                        detail::shape_string(t.shape()));
        if (!(t.layout() == from_) || !(out.layout() == to_))
            throw error("xshard: redistribution: the plan is from " + from_.to_string() + " to " +
                        to_.to_string() + ", the tensors are " + t.layout().to_string() + " and " +
                        out.layout().to_string());
    }

    /// This rank's shards: never read or write past them.
    void check_local(const D& t, const result_type& out) const {
        if (detail::shard_resized(t) || detail::shard_resized(out))
            throw error("xshard: redistribute: a shard on rank " + std::to_string(mesh_.rank()) +
                        " was resized (it no longer has the shape its layout gives it)");
    }

    typename D::mesh_type mesh_;
    layout from_;
    layout to_;
    redistribution_plan<typename D::value_type, rank> plan_;
};

/// A reusable plan from the layout of tensors like `like` to To (with
/// `To = dynamic_layout(rank)`, to the run-time layout `to`).
template <layout To, distributed_tensor D>
redistribution<std::remove_cvref_t<D>, To> make_redistribution(const D& like, const layout& to = To,
                                                               const cost_model& model = {},
                                                               const reduce_tuning& tuning = {}) {
    static_assert(To.rank() == std::remove_cvref_t<D>::rank,
                  "xshard: redistribution between layouts of different ranks");
    return redistribution<std::remove_cvref_t<D>, To>(like, to, model, tuning);
}

/// `t` in layout To (with `To = dynamic_layout(rank)`, in the run-time layout `to`): the
/// collectives of the cheapest plan (see planner.hpp). For layout types the candidate step
/// sequences are computed at compile time; choosing among them, the geometry and the
/// datatypes are run-time work, redone by every call (build a plan with
/// make_redistribution to do it once). A tensor already in layout To is returned as it is:
/// moved if the caller moves it in, copied otherwise. Collective over the mesh.
template <layout To, distributed_tensor D>
auto redistribute(D&& t, const layout& to = To) {
    using X = std::remove_cvref_t<D>;
    static_assert(To.rank() == X::rank,
                  "xshard: redistribution between layouts of different ranks");
    using result_type = dtensor<typename X::value_type, typename X::mesh_type, To>;
    const auto& target = detail::layout_for<To>(to, t.mesh().shape());
    if (t.layout() == target) {
        auto mesh = t.mesh();
        auto shape = t.shape();
        return result_type(detail::unchecked, mesh, shape,
                           typename result_type::local_type(std::forward<D>(t).local()), target);
    }
    return redistribution<X, To>(t, target)(t);
}

/// The backward pass of `redistribute`: from the gradient of a redistribution's output
/// (laid out as the dual of the output's layout, see `dual`), the gradient of its input, laid
/// out as the dual of `from`, the input's layout. That is the adjoint redistribution, derived
/// from the layout transition alone: no layer writes its own backward collectives.
/// Collective over the mesh.
template <distributed_tensor G>
auto redistribute_adjoint(G&& grad, const layout& from) {
    constexpr std::size_t rank = std::remove_cvref_t<G>::rank;
    const auto to = dual(from, grad.mesh().shape());
    return redistribute<dynamic_layout(rank)>(std::forward<G>(grad), to);
}

} // namespace xshard
