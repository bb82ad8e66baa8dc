#pragma once
/// \file
/// One slot of a sharded call (an input or an output): what the call records about it when
/// traced, and its redistribution, with the plan kept in the callable's plan cache so that
/// the next call with the same shape and layouts runs it without planning again.

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/shard/plan_cache.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace xshard::detail {

/// Where a call records what it did (when traced) and keeps its plans between calls.
struct call_log {
    std::string* report = nullptr; ///< null when not tracing
    plan_cache* plans = nullptr;
};

/// An input or output of a call: "input 1", "output 0"; the label is built only when traced.
struct slot {
    const char* kind;
    std::size_t index;
    std::size_t plan; ///< its plan slot
    std::string label() const { return std::string(kind) + " " + std::to_string(index); }
};

/// Appends "label: from -> to" and the plan's steps to the report (when tracing).
XSHARD_DECL void note(const call_log& log, const slot& s, const char* what, const layout& from,
                      const layout& to, const std::string& plan);

/// Redistributes a distributed tensor to `to`, with the plan kept in the call's slot for the
/// next call (plans are built once per call site, shape and layouts), or returns it as it is.
/// The tensors a call hands itself are its own, so the plan runs without the collective
/// check for resized shards.
template <layout To, class D>
auto relayout(D&& t, const layout& to, const call_log& log, const slot& s) {
    using X = std::remove_cvref_t<D>;
    using plan_type = redistribution<X, To>;
    if (t.layout() == to) {
        note(log, s, "", t.layout(), to, "");
        return redistribute<To>(std::forward<D>(t), to);
    }
    auto* plan = log.plans->find<plan_type>(s.plan);
    if (!plan || !plan->fits(t, to))
        plan = &log.plans->emplace<plan_type>(s.plan, t, to);
    if (log.report) // the printout only when tracing: it is not free
        note(log, s, "", t.layout(), to, plan->describe());
    typename plan_type::result_type out(
        unchecked, t.mesh(), t.shape(),
        plan_type::result_type::local_type::from_shape(plan->plan().destination_block().extent),
        to);
    plan->execute_unchecked(t, out);
    return out;
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/shard/relayout.ipp>
#endif
