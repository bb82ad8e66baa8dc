#pragma once
/// \file
/// The callable shard() and shard_local() return (see shard/shard.hpp): it prepares the
/// inputs by their specs (shard/inputs.hpp), runs the user's callable with its outcome agreed
/// over the mesh, and hands back the outputs by their specs (shard/outputs.hpp). Its mode
/// (shard/options.hpp) fixes what the callable receives, the mesh type of the tensors it
/// receives, and whether the `none` input specs are derived (shard/derivation.hpp). Copies
/// share the plans, the derived layouts and the trace.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/redistribute/meter.hpp>
#include <xshard/shard/derivation.hpp>
#include <xshard/shard/inputs.hpp>
#include <xshard/shard/options.hpp>
#include <xshard/shard/outputs.hpp>
#include <xshard/shard/plan_cache.hpp>
#include <xshard/shard/relayout.hpp>
#include <xshard/shard/spec.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// The callable shard() (global semantics) and shard_local() (local semantics) return: `fn`
/// on the mesh, with input specs `In` (a tuple, one per argument), output specs `Out` (one,
/// or a tuple for a tuple of outputs) and mode `Mode`. See shard/shard.hpp.
template <mesh_type Mesh, class F, class In, class Out, shard_mode Mode>
class sharded {
public:
    sharded(Mesh mesh, F fn, In in, Out out, std::optional<parameter_plan> plan, int level = 0)
        : mesh_(std::move(mesh))
        , fn_(std::move(fn))
        , in_(std::move(in))
        , out_(std::move(out))
        , plan_(std::move(plan))
        , level_(level)
        , report_(std::make_shared<std::string>())
        , plans_(std::make_shared<detail::plan_cache>())
        , derivations_(std::make_shared<detail::derivation_cache>())
        , derived_(std::make_shared<const std::vector<std::optional<layout>>*>(nullptr)) {
        if (!is_objective_level(level))
            throw error(bad_objective_level("xshard: shard: sharding_propagation's level", level));
    }

    /// Records, from the next call on, the layouts and redistributions of each call.
    sharded& traced(bool on = true) {
        trace_ = on;
        return *this;
    }

    /// The layouts of the last traced call's inputs and outputs and its redistribution steps.
    std::string describe() const { return *report_; }

    /// The mesh, the callable and its input and output specs (shard/vjp.hpp traces them).
    const Mesh& mesh() const noexcept { return mesh_; }
    const F& function() const noexcept { return fn_; }
    const In& in_specs() const noexcept { return in_; }
    const Out& out_specs() const noexcept { return out_; }
    /// Whether the callable works on local shards (shard_local).
    static constexpr bool local_semantics = detail::local_semantics(Mode);

    /// Under sharding_propagation: the layout the last call derived for each input whose spec
    /// is `none` (nullopt for the others); empty before the first call.
    const std::vector<std::optional<layout>>& derived_layouts() const {
        static const std::vector<std::optional<layout>> none_yet;
        return *derived_ ? **derived_ : none_yet;
    }

    template <class... Args>
    auto operator()(Args&&... args) const {
        static_assert(std::tuple_size_v<In> == sizeof...(Args),
                      "xshard: shard: give one input spec per argument (xshard::none to keep one)");
        const detail::call_log log{trace_ ? report_.get() : nullptr, plans_.get()};
        if (log.report)
            log.report->clear();
        if constexpr (detail::derives_layouts(Mode))
            return call_deriving(log, std::index_sequence_for<Args...>{},
                                 std::forward<Args>(args)...);
        else
            return call(in_, log, nullptr, std::index_sequence_for<Args...>{},
                        std::forward<Args>(args)...);
    }

private:
    using call_mesh =
        std::conditional_t<detail::inserts_redistributions(Mode), redistributing_mesh<Mesh>, Mesh>;
    using derived_layout_list = std::vector<std::optional<layout>>;

    /// One call with input specs `in`; adds the bytes of fn's inputs and outputs to `memory`.
    template <class Specs, std::size_t... I, class... Args>
    auto call(const Specs& in, const detail::call_log& log, std::size_t* memory,
              std::index_sequence<I...>, Args&&... args) const {
        const call_mesh cm = make_call_mesh();
        std::optional<detail::plan_use> use;
        if (plan_)
            use.emplace(detail::plan_use{*plan_, {}});
        detail::plan_use* plan = use ? &*use : nullptr;
        // The prepared inputs, held by reference where nothing changes, by value otherwise.
        std::tuple<decltype(detail::shard_input(mesh_, cm, std::forward<Args>(args),
                                                std::get<I>(in), plan, log,
                                                detail::slot{"input", I, I}))...>
            inputs{detail::shard_input(mesh_, cm, std::forward<Args>(args), std::get<I>(in), plan,
                                       log, detail::slot{"input", I, I})...};
        if (plan)
            plan->check_used(); // the same names on every rank: raised alike
        // Agreed before any collective that follows: a callable that throws on some ranks
        // raises on every rank (its own exception where it threw, xshard::error naming the
        // rank elsewhere) instead of leaving the others in an output's redistribution.
        decltype(auto) result = agreed(mesh_.comm(), [&]() -> decltype(auto) {
            return invoke(inputs, std::index_sequence<I...>{});
        });
        if (memory)
            *memory += detail::local_bytes(inputs) + detail::local_bytes(result);
        return finish(std::forward<decltype(result)>(result), log, sizeof...(I));
    }

    /// The input specs with the derived layouts in place of the derived inputs' `none`.
    template <class... Args, std::size_t... I>
    auto derived_specs(const derived_layout_list& derived, std::index_sequence<I...>) const {
        return std::tuple<detail::derived_spec_t<std::tuple_element_t<I, In>, Args>...>(
            detail::derived_spec<detail::derived_spec_t<std::tuple_element_t<I, In>, Args>>(
                std::get<I>(in_), derived[I])...);
    }

    /// Derives the `none` inputs' layouts (once per key: shard/derivation.hpp), then calls.
    template <std::size_t... I, class... Args>
    auto call_deriving(const detail::call_log& log, std::index_sequence<I...> seq,
                       Args&&... args) const {
        const auto inputs = detail::derived_inputs_of<In>(mesh_, seq, args...);
        if (inputs.arrays)
            detail::check_key_agrees(mesh_.comm(), inputs.key);
        auto found = derivations_->find(inputs.key);
        if (found == derivations_->end()) {
            auto cost_of = [&](const derived_layout_list& candidate) {
                return trial<Args...>(candidate, seq, args...);
            };
            found = derivations_
                        ->emplace(inputs.key,
                                  detail::cheapest_assignment(
                                      detail::derivation_options(mesh_, inputs), level_, cost_of))
                        .first;
        }
        const auto& derived = found->second;
        *derived_ = &derived; // a node of the map: its address stays
        detail::note_derived(log, inputs.kept, derived, level_);
        return call(derived_specs<Args...>(derived, seq), log, nullptr, seq,
                    std::forward<Args>(args)...);
    }

    /// The agreed cost of one assignment of derived layouts: the call run twice (the first
    /// builds its plans) on copies of the arguments; nullopt when it raised on any rank.
    template <class... Args, std::size_t... I>
    std::optional<detail::trial_cost> trial(const derived_layout_list& derived,
                                            std::index_sequence<I...> seq,
                                            const std::remove_reference_t<Args>&... args) const {
        const auto specs = derived_specs<Args...>(derived, seq);
        const detail::call_log quiet{nullptr, plans_.get()};
        // seconds, communication, memory: the maximum over the ranks.
        std::array<double, 3> cost{std::numeric_limits<double>::max(), 0, 0};
        for (int run = 0; run < 2; ++run) {
            std::size_t memory = 0;
            redistribution_meter meter;
            const auto start = std::chrono::steady_clock::now();
            bool failed = false;
            try {
                (void)call(specs, quiet, &memory, seq, copy_of(args)...);
                const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
                cost = {std::min(cost[0], took.count()), meter.seconds(), double(memory)};
            } catch (...) {
                failed = true;
            }
            // A failure the callable's agreement did not cover (a rank out of memory) still
            // ends the trial on every rank.
            if (first_reporting_rank(mesh_.comm(), failed) >= 0)
                return std::nullopt;
        }
        allreduce(mesh_.comm(), cost, reduction::max);
        return detail::trial_cost{cost[0], cost[1], cost[2]};
    }

    /// What a trial hands the call: a reference to a parameter (laid out in place by its
    /// plan, which every trial repeats alike), a copy of anything else.
    template <class A>
    static decltype(auto) copy_of(const A& a) {
        if constexpr (detail::is_parameter<A>::value)
            return const_cast<A&>(a);
        else
            return A(a);
    }

    call_mesh make_call_mesh() const {
        if constexpr (detail::inserts_redistributions(Mode))
            return call_mesh(mesh_);
        else
            return mesh_;
    }

    template <class Tuple, std::size_t... I>
    decltype(auto) invoke(Tuple& inputs, std::index_sequence<I...>) const {
        if constexpr (detail::local_semantics(Mode))
            return fn_(detail::local_of_arg(std::get<I>(inputs))...);
        else
            return fn_(std::get<I>(inputs)...);
    }

    template <class R>
    auto finish(R&& result, const detail::call_log& log, std::size_t inputs) const {
        using X = std::remove_cvref_t<R>;
        if constexpr (detail::is_tuple<X>::value) {
            return [&]<std::size_t... J>(std::index_sequence<J...>) {
                return std::make_tuple(
                    one_output<J>(std::get<J>(std::forward<R>(result)), log, inputs)...);
            }
            (std::make_index_sequence<std::tuple_size_v<X>>{});
        } else {
            return one_output<0>(std::forward<R>(result), log, inputs);
        }
    }

    template <std::size_t J, class R>
    auto one_output(R&& r, const detail::call_log& log, std::size_t inputs) const {
        const detail::slot what{"output", J, inputs + J};
        if constexpr (detail::local_semantics(Mode))
            return detail::wrap_local(mesh_, std::forward<R>(r), detail::spec_at<Out, J>(out_), log,
                                      what);
        else
            return detail::shard_output(mesh_, std::forward<R>(r), detail::spec_at<Out, J>(out_),
                                        log, what);
    }

    Mesh mesh_;
    F fn_;
    In in_;
    Out out_;
    std::optional<parameter_plan> plan_;
    int level_ = 0;
    bool trace_ = false;
    std::shared_ptr<std::string> report_;
    std::shared_ptr<detail::plan_cache> plans_; // the plans of each input and output
    std::shared_ptr<detail::derivation_cache> derivations_;
    /// The last call's entry of `derivations_` (none before the first call).
    std::shared_ptr<const derived_layout_list*> derived_;
};

} // namespace xshard
