#pragma once
/// \file
/// The plans a sharded callable keeps between calls: one set per input or output slot, each
/// plan found by its type. A callable called with float tensors, then with double ones of the
/// same layouts, keeps a plan of each; a plan is never cast to another type.

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace xshard::detail {

/// A plan kept between calls, of any type.
struct cached_plan {
    virtual ~cached_plan() = default;
};
template <class Plan>
struct typed_plan final : cached_plan {
    template <class... A>
    explicit typed_plan(A&&... a)
        : plan(std::forward<A>(a)...) {}
    Plan plan;
};

/// The plans of a sharded callable: by input or output slot, then by plan type.
class plan_cache {
public:
    /// The cached plan of type Plan in slot `slot`, or null.
    template <class Plan>
    Plan* find(std::size_t slot) const {
        if (slot >= slots_.size())
            return nullptr;
        for (const auto& p : slots_[slot])
            if (auto* typed = dynamic_cast<typed_plan<Plan>*>(p.get()))
                return &typed->plan;
        return nullptr;
    }

    /// Caches a new plan of type Plan in slot `slot` (replacing one of the same type) and
    /// returns it.
    template <class Plan, class... A>
    Plan& emplace(std::size_t slot, A&&... a) {
        if (slot >= slots_.size())
            slots_.resize(slot + 1);
        auto made = std::make_unique<typed_plan<Plan>>(std::forward<A>(a)...);
        Plan& plan = made->plan;
        auto& entries = slots_[slot];
        for (auto& p : entries)
            if (dynamic_cast<typed_plan<Plan>*>(p.get())) {
                p = std::move(made);
                return plan;
            }
        entries.push_back(std::move(made));
        return plan;
    }

private:
    std::vector<std::vector<std::unique_ptr<cached_plan>>> slots_;
};

} // namespace xshard::detail
