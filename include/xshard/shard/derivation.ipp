#pragma once
/// \file
/// The definitions of what shard/derivation.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/shard/derivation.hpp>

namespace xshard::detail {

XSHARD_DECL void check_key_agrees(const communicator& c, const std::string& key) {
    const auto hash = static_cast<unsigned long long>(std::hash<std::string>{}(key));
    if (!value_ranges<1>(c, {hash})[0].agrees())
        throw error("xshard: shard: the ranks call with different layouts or shapes of "
                    "the inputs to derive: " +
                    key);
}

XSHARD_DECL bool cheaper(int level, const trial_cost& a, const trial_cost& b) {
    constexpr double noise = 0.02, exact = 1e-9;
    auto less = [](double x, double y, double tol) {
        return x < y - tol * std::max(y, 1e-300);
    };
    const auto ka = objective_of(level, a.seconds, a.communication, a.memory);
    const auto kb = objective_of(level, b.seconds, b.communication, b.memory);
    const double tp = level == 2 ? noise : exact, ts = level == 2 ? exact : noise;
    if (less(ka.first, kb.first, tp))
        return true;
    if (less(kb.first, ka.first, tp))
        return false;
    return less(ka.second, kb.second, ts);
}

XSHARD_DECL void note_derived(const call_log& log, const std::vector<std::optional<layout>>& kept,
                              const std::vector<std::optional<layout>>& derived, int level) {
    if (!log.report)
        return;
    for (std::size_t i = 0; i < derived.size(); ++i)
        if (derived[i])
            *log.report += "input " + std::to_string(i) + " derived (level " +
                           std::to_string(level) + "): " + kept[i]->to_string() + " -> " +
                           derived[i]->to_string() + "\n";
}

} // namespace xshard::detail

